/* tensorvault dashboard, the Imports page (placeholder until it is built). */
"use strict";

(function () {
  TV.register("imports", {
    init: function (sec) {
      var p = TV.el("section", "panel");
      p.appendChild(TV.el("h2", null, "Imports"));
      sec.appendChild(p);
    }
  });
})();
