// Flotilla console: the only script. Deadline countdowns, optional auto-refresh,
// and copying a decoded dead letter into the re-queue form. Pages work without it.
(function () {
  "use strict";
  var loadedAt = Date.now();

  function countdowns() {
    var nodes = document.querySelectorAll("[data-seconds-left]");
    nodes.forEach(function (node) {
      var initial = parseFloat(node.getAttribute("data-seconds-left"));
      var left = Math.max(0, Math.round(initial - (Date.now() - loadedAt) / 1000));
      if (left <= 0) {
        node.textContent = "deadline passed";
        node.classList.add("expired");
        document.querySelectorAll(".approve-form button").forEach(function (b) { b.disabled = true; });
      } else {
        var m = Math.floor(left / 60), s = left % 60;
        node.textContent = m + ":" + (s < 10 ? "0" : "") + s + " left";
        node.classList.toggle("urgent", left < 60);
      }
    });
  }

  function autoRefresh() {
    var box = document.getElementById("auto-refresh");
    if (!box) { return; }
    var seconds = parseFloat(box.getAttribute("data-seconds")) || 5;
    var timer = null;
    function arm() {
      if (timer) { clearTimeout(timer); timer = null; }
      if (box.checked) { timer = setTimeout(function () { window.location.reload(); }, seconds * 1000); }
    }
    box.addEventListener("change", arm);
    arm();
  }

  function copyDecoded() {
    var button = document.getElementById("copy-decoded");
    if (!button) { return; }
    button.addEventListener("click", function () {
      var source = document.getElementById(button.getAttribute("data-source"));
      var target = document.getElementById(button.getAttribute("data-target"));
      if (source && target) { target.value = source.textContent; target.focus(); }
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    countdowns();
    setInterval(countdowns, 1000);
    autoRefresh();
    copyDecoded();
  });
})();
