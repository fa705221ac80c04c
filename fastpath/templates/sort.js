document.querySelectorAll("table.sortable thead th").forEach(function (th) {
  th.title = "sort";
  th.addEventListener("click", function () {
    var table = th.closest("table"), body = table.tBodies[0], col = th.cellIndex;
    var asc = th.getAttribute("aria-sort") !== "ascending";
    table.querySelectorAll("thead th").forEach(function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", asc ? "ascending" : "descending");
    var key = function (row) {
      var t = row.cells[col] ? row.cells[col].textContent.trim() : "";
      var n = parseFloat(t.replace(/,/g, ""));
      return /^[-+]?[0-9.]/.test(t) && !isNaN(n) ? n : t;
    };
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = key(a), y = key(b);
      var c = typeof x === typeof y ? (x < y ? -1 : x > y ? 1 : 0) : (typeof x === "number" ? -1 : 1);
      return asc ? c : -c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  });
});
