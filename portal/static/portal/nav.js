// The top bar's "More" menu is a native <details>: Enter or Space on its summary opens and
// closes it without this script. This adds what a menu is expected to do besides: Escape
// closes it and puts focus back on "More"; a click or focus elsewhere closes it.
"use strict";

(function () {
  document.addEventListener("DOMContentLoaded", function () {
    var menu = document.getElementById("nav-more");
    if (!menu) return;
    var summary = menu.querySelector("summary");
    menu.addEventListener("keydown", function (event) {
      if (event.key === "Escape" && menu.open) {
        menu.open = false;
        summary.focus();
      }
    });
    document.addEventListener("click", function (event) {
      if (menu.open && !menu.contains(event.target)) menu.open = false;
    });
    menu.addEventListener("focusout", function (event) {
      if (menu.open && event.relatedTarget && !menu.contains(event.relatedTarget)) menu.open = false;
    });
  });
})();
