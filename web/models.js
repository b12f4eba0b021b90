/* tensorvault dashboard, the Models page (placeholder until it is built). */
"use strict";

(function () {
  TV.register("models", {
    init: function (sec) {
      var p = TV.el("section", "panel");
      p.appendChild(TV.el("h2", null, "Models"));
      sec.appendChild(p);
    }
  });
})();
