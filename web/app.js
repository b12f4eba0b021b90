"use strict";
// Placeholder (the webui helper's page replaces it): shows /v1/status.
fetch("/v1/status").then(function (r) { return r.json(); }).then(function (s) {
  document.getElementById("status").textContent = JSON.stringify(s);
}, function (e) {
  document.getElementById("status").textContent = "request failed: " + e;
});
