/* tensorvault dashboard, the Tensors page (placeholder until it is built). */
"use strict";

(function () {
  TV.register("tensors", {
    init: function (sec) {
      var p = TV.el("section", "panel");
      p.appendChild(TV.el("h2", null, "Tensors"));
      sec.appendChild(p);
    }
  });
})();
