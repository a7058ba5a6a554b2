// rdpp compare's page script (rdpp_cli/reporting/compare_page.py writes it into index.html).
// The index (one row per image: id, thumbnail, data chunk and slot, trade-off, its pair, the
// models' mean / oracle / self-CIDEr, the words) is sorted and filtered here; the captions of the
// images on the page come from data/chunk-NNNN.js files, loaded when needed. Every text is set
// with textContent: nothing from the data is ever parsed as HTML.
(function () {
  "use strict";
  var IX = JSON.parse(document.getElementById("rdpp-index").textContent);
  var M = IX.models.length;
  var chunks = {}, waiting = {};
  var state = {sort: "tradeoff", metric: 1, a: 0, b: Math.min(1, M - 1), id: "", word: "", page: 0};
  var $ = function (id) { return document.getElementById(id); };

  window.rdppChunk = function (k, records) {
    chunks[k] = records;
    (waiting[k] || []).forEach(function (done) { done(); });
    delete waiting[k];
  };

  function loadChunk(k) {
    return new Promise(function (done) {
      if (chunks[k]) { done(); return; }
      if (waiting[k]) { waiting[k].push(done); return; }
      waiting[k] = [done];
      var s = document.createElement("script");
      s.src = "data/chunk-" + String(k).padStart(4, "0") + ".js";
      s.onerror = function () { chunks[k] = []; done(); };
      document.head.appendChild(s);
    });
  }

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function queryWords(text) { return (text.toLowerCase().match(/[\p{L}\p{N}_]+/gu) || []); }

  // no "-0.000" from float rounding; "–" where there is no number (self-CIDEr of a one-caption set)
  function fmt(x) { return x === null ? "–" : x.toFixed(3).replace("-0.000", "0.000"); }

  function selected() {
    var rows = IX.images.slice();
    var ids = state.id.split(/[\s,]+/).filter(Boolean);
    if (ids.length) rows = rows.filter(function (r) { return ids.indexOf(String(r[0])) >= 0; });
    var words = queryWords(state.word);
    if (words.length) rows = rows.filter(function (r) {
      var have = " " + r[8] + " ";
      return words.every(function (w) { return have.indexOf(" " + w + " ") >= 0; });
    });
    if (state.sort === "id") rows.sort(function (x, y) { return x[0] - y[0]; });
    else if (state.sort === "diff") {
      var lead = function (r) {
        var a = r[7][3 * state.a + state.metric], b = r[7][3 * state.b + state.metric];
        return a === null || b === null ? -Infinity : a - b;  // no number: last
      };
      rows.sort(function (x, y) { return lead(y) - lead(x) || x[0] - y[0]; });
    }
    return rows;
  }

  // the text with every word of the query marked, built from text nodes
  function marked(parent, text, words) {
    if (!words.length) { parent.appendChild(document.createTextNode(text)); return; }
    var parts = text.split(/([\p{L}\p{N}_]+)/u);
    parts.forEach(function (p) {
      if (words.indexOf(p.toLowerCase()) >= 0) parent.appendChild(el("mark", "", p));
      else parent.appendChild(document.createTextNode(p));
    });
  }

  function setCard(row, rec, words) {
    var s, j, m, card = el("div", "card");
    card.dataset.id = row[0];
    var photo = el("div", "photo");
    if (row[1]) {
      var img = el("img");
      img.loading = "lazy"; img.src = row[1]; img.alt = "image " + row[0];
      photo.appendChild(img);
    } else {
      photo.appendChild(el("div", "placeholder", "no photo: " + (rec.w || IX.photo_note || "not recorded by the data")));
    }
    photo.appendChild(el("div", "meta", "image " + row[0] + (rec.f ? " · " + rec.f : "")));
    if (row[5] >= 0 && state.sort === "tradeoff") {
      var a = row[5], b = row[6];
      photo.appendChild(el("div", "why", IX.models[a] + " over " + IX.models[b] + ": self-CIDEr " +
        fmt(row[7][3 * a + 2]) + " vs " + fmt(row[7][3 * b + 2]) + ", oracle " + fmt(row[7][3 * a + 1]) +
        " vs " + fmt(row[7][3 * b + 1])));
    }
    card.appendChild(photo);
    var sets = el("div", "sets"), refs = el("div", "refs"), ol = el("ol");
    refs.appendChild(el("h3", "", "references"));
    rec.r.forEach(function (t) { var li = el("li"); marked(li, t, words); ol.appendChild(li); });
    refs.appendChild(ol);
    sets.appendChild(refs);
    for (m = 0; m < M; m++) {
      s = rec.s[m];
      var box = el("div", "set"), list = el("ol"), chosen = s[2], best = -1;
      chosen.forEach(function (k) { if (best < 0 || s[1][k] > s[1][best]) best = k; });
      box.appendChild(el("h3", "", IX.models[m]));
      box.appendChild(el("div", "stats", "oracle " + fmt(row[7][3 * m + 1]) + " · mean " + fmt(row[7][3 * m]) +
        " · self-CIDEr " + fmt(row[7][3 * m + 2]) + (IX.selection[m] ? " · " + IX.selection[m] : "")));
      for (j = 0; j < s[0].length; j++) {
        var li = el("li", j === best ? "best" : chosen.indexOf(j) < 0 ? "out" : "");
        if (IX.selection[m] && chosen.indexOf(j) >= 0) li.appendChild(el("span", "ok", "✓ "));
        marked(li, s[0][j], words);
        li.appendChild(el("span", "s", "CIDEr-D " + fmt(s[1][j])));
        list.appendChild(li);
      }
      box.appendChild(list);
      sets.appendChild(box);
    }
    card.appendChild(sets);
    return card;
  }

  var drawing = 0;
  function render() {
    var ticket = ++drawing, rows = selected(), per = IX.per_page;
    var pages = Math.max(1, Math.ceil(rows.length / per));
    state.page = Math.min(Math.max(0, state.page), pages - 1);
    var shown = rows.slice(state.page * per, (state.page + 1) * per);
    $("count").textContent = rows.length + " of " + IX.images.length + " images";
    $("pageinfo").textContent = "page " + (state.page + 1) + " of " + pages;
    document.documentElement.dataset.state = "loading";
    var need = shown.map(function (r) { return r[2]; }).filter(function (k, i, xs) { return xs.indexOf(k) === i; });
    Promise.all(need.map(loadChunk)).then(function () {
      if (ticket !== drawing) return;
      var words = queryWords(state.word), box = $("cards");
      box.textContent = "";
      shown.forEach(function (r) { box.appendChild(setCard(r, (chunks[r[2]] || [])[r[3]] || {r: [], s: []}, words)); });
      document.documentElement.dataset.shown = shown.map(function (r) { return r[0]; }).join(",");
      document.documentElement.dataset.state = "ready";
    });
  }

  function toHash() {
    var h = ["sort=" + state.sort, "metric=" + state.metric, "a=" + state.a, "b=" + state.b, "page=" + state.page];
    if (state.id) h.push("id=" + encodeURIComponent(state.id));
    if (state.word) h.push("word=" + encodeURIComponent(state.word));
    history.replaceState(null, "", "#" + h.join("&"));
  }

  function fromHash() {
    location.hash.replace(/^#/, "").split("&").forEach(function (kv) {
      var p = kv.split("="), k = p[0], v = decodeURIComponent(p.slice(1).join("=") || "");
      if (k === "sort" && ["tradeoff", "diff", "id"].indexOf(v) >= 0) state.sort = v;
      else if (["metric", "a", "b", "page"].indexOf(k) >= 0 && /^\d+$/.test(v)) state[k] = parseInt(v, 10);
      else if (k === "id" || k === "word") state[k] = v;
    });
    state.metric = Math.min(state.metric, 2);
    state.a = Math.min(state.a, M - 1); state.b = Math.min(state.b, M - 1);
  }

  function controls() {
    ["a", "b"].forEach(function (k) {
      IX.models.forEach(function (name, m) { var o = el("option", "", name); o.value = m; $(k).appendChild(o); });
    });
    ["sort", "metric", "a", "b", "id", "word"].forEach(function (k) { $(k).value = state[k]; });
    var changed = function () {
      state.sort = $("sort").value; state.metric = +$("metric").value; state.a = +$("a").value;
      state.b = +$("b").value; state.id = $("id").value.trim(); state.word = $("word").value.trim();
      state.page = 0; toHash(); render();
    };
    ["sort", "metric", "a", "b"].forEach(function (k) { $(k).addEventListener("change", changed); });
    ["id", "word"].forEach(function (k) { $(k).addEventListener("input", changed); });
    $("prev").addEventListener("click", function () { state.page--; toHash(); render(); window.scrollTo(0, 0); });
    $("next").addEventListener("click", function () { state.page++; toHash(); render(); window.scrollTo(0, 0); });
  }

  fromHash();
  controls();
  render();
})();
