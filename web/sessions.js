/* tensorvault dashboard, the Sessions page (placeholder until it is built). */
"use strict";

(function () {
  TV.register("sessions", {
    init: function (sec) {
      var p = TV.el("section", "panel");
      p.appendChild(TV.el("h2", null, "Sessions"));
      sec.appendChild(p);
    }
  });
})();
