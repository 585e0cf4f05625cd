// Attention viewer shared by `transformer attention --out FILE.html` and the page of `transformer serve`.
// maps = {src, tgt_in, tgt_out, scale, shape: {kind: [L, H, Tq, Tk]}, weights: {kind: flat integers}} (the
// compact form of figures.AttentionMaps.to_json: weight = integer / scale, row-major over [layer][head][query][key]).
// Links view: one colour per head, a line from each query token (left) to each key token (right), opacity =
// weight (as the paper's Figures 3-5). Heatmap view: one matrix per head (ours). Hover a token to isolate its
// links (Figures 3 and 4, bottom, show one word's).
// Words: a piece starting with ▁ (or a special token) starts a word; a word's weight as a key is the sum over
// its pieces, as a query the mean (figures.AttentionMaps.merged, which draws the PNG figures, does the same).
"use strict";

const KINDS = {enc_self: "encoder self-attention", dec_self: "decoder self-attention", cross: "encoder-decoder attention"};
const COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                 "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd"];
const SVG = "http://www.w3.org/2000/svg";
const ROWS = {enc_self: "src", dec_self: "tgt_out", cross: "tgt_out"}, COLS = {enc_self: "src", dec_self: "tgt_in", cross: "src"};

function el(tag, attrs, parent, ns) {
  const node = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "text") node.textContent = v; else node.setAttribute(k, v);
  }
  if (parent) parent.appendChild(node);
  return node;
}

function axes(maps, kind) {
  return [maps[ROWS[kind]], maps[COLS[kind]]];
}

// the compact maps as nested arrays of weights: weights[kind][layer][head][query][key]
function unpack(maps) {
  const out = {src: maps.src, tgt_in: maps.tgt_in, tgt_out: maps.tgt_out, weights: {}};
  for (const [kind, flat] of Object.entries(maps.weights)) {
    const [nL, nH, nQ, nK] = maps.shape[kind];
    let i = 0;
    out.weights[kind] = Array.from({length: nL}, () => Array.from({length: nH}, () => Array.from({length: nQ}, () =>
      Array.from({length: nK}, () => flat[i++] / maps.scale))));
  }
  return out;
}

// words and the piece indices of each, exactly as figures._word_groups (the PNG figures) makes them
function wordGroups(tokens) {
  const words = [], groups = [];
  tokens.forEach((tok, i) => {
    const special = tok === "<s>" || tok === "</s>";
    if (!groups.length || special || tok.startsWith("\u2581") || ["<s>", "</s>"].includes(words[words.length - 1])) {
      words.push(special ? tok : tok.replace(/^\u2581/, ""));  // a lone "▁" starts a word of what follows
      groups.push([i]);
    } else {
      words[words.length - 1] += tok;
      groups[groups.length - 1].push(i);
    }
  });
  return [words.map(w => w || "\u2581"), groups];  // a "▁" with nothing after it is shown as itself
}

function mergeWords(maps) {
  const groups = {};
  for (const side of ["src", "tgt_in", "tgt_out"]) groups[side] = wordGroups(maps[side]);
  const out = {src: groups.src[0], tgt_in: groups.tgt_in[0], tgt_out: groups.tgt_out[0], weights: {}};
  for (const [kind, w] of Object.entries(maps.weights)) {
    const rows = groups[ROWS[kind]][1], cols = groups[COLS[kind]][1];
    out.weights[kind] = w.map(layer => layer.map(head => rows.map(r => cols.map(c =>
      r.reduce((sum, q) => sum + c.reduce((s, k) => s + head[q][k], 0), 0) / r.length))));
  }
  return out;
}

// opening: what the page opens at (`transformer attention --kind --layer --heads --style --words` for an .html)
function renderAttention(root, maps, opening) {
  const pieces = unpack(maps);
  const data = {pieces: pieces, words: mergeWords(pieces)};
  root.innerHTML = "";
  root.classList.add("attn");
  const controls = el("div", {class: "attn-controls"}, root);
  const view = el("div", {class: "attn-view"}, root);
  const state = Object.assign({kind: "enc_self", layer: 0, head: "all", style: "links", unit: "pieces"}, opening);
  const nHeads = data.pieces.weights.enc_self[0].length;

  function select(name, options, key, parse) {
    const label = el("label", {text: name + " "}, controls);
    const s = el("select", {name: key}, label);
    for (const [value, text] of options) el("option", {value: value, text: text}, s);
    s.value = String(state[key]);
    s.addEventListener("change", () => { state[key] = parse ? parse(s.value) : s.value; draw(); });
    return s;
  }
  select("attention", Object.entries(KINDS), "kind");
  const layerMenu = select("layer", [], "layer", Number);
  select("head", [["all", "all"], ...[...Array(nHeads).keys()].map(i => [i, String(i + 1)])], "head",
         v => v === "all" ? "all" : Number(v));
  select("view", [["links", "links (Figs. 3-5)"], ["heatmap", "heatmaps"]], "style");
  select("tokens", [["pieces", "sub-words"], ["words", "words"]], "unit");

  function layers() {  // the kind's stack: the encoder's and the decoder's depths may differ
    const n = data.pieces.weights[state.kind].length;
    state.layer = Math.min(state.layer, n - 1);
    layerMenu.innerHTML = "";
    for (let i = 0; i < n; i++) el("option", {value: i, text: String(i + 1)}, layerMenu);
    layerMenu.value = String(state.layer);
  }

  function draw() {
    layers();
    view.innerHTML = "";
    const maps = data[state.unit];
    const [rows, cols] = axes(maps, state.kind);
    const w = maps.weights[state.kind][state.layer];
    const heads = state.head === "all" ? [...Array(nHeads).keys()] : [state.head];
    (state.style === "links" ? drawLinks : drawHeatmaps)(view, rows, cols, w, heads);
  }
  draw();
}

function drawLinks(view, rows, cols, w, heads) {
  const step = 20, width = 520, n = Math.max(rows.length, cols.length);
  const svg = el("svg", {width: width, height: n * step + 30, class: "attn-links"}, view, SVG);
  const x0 = 190, x1 = width - 190;
  for (const h of heads) {
    const g = el("g", {"data-head": h + 1}, svg, SVG);
    for (let i = 0; i < rows.length; i++) {
      for (let j = 0; j < cols.length; j++) {
        const a = w[h][i][j];
        if (a < 0.02) continue;
        el("line", {x1: x0, y1: 20 + i * step, x2: x1, y2: 20 + j * step, stroke: COLOURS[h % COLOURS.length],
                    "stroke-width": 2.5, "stroke-opacity": (a / Math.sqrt(heads.length)).toFixed(3),
                    "data-weight": a, "data-q": i, "data-k": j}, g, SVG);
      }
    }
  }
  // hovering a token shows its links alone; the drawing stays (redrawn, the token under the pointer was
  // replaced, its mouseleave never came, and the view stayed isolated)
  function focus(side, i, label) {
    for (const line of svg.querySelectorAll("line")) {
      const shown = side === null || line.getAttribute("data-" + side) === String(i);
      if (shown) line.removeAttribute("display"); else line.setAttribute("display", "none");
    }
    if (label) label.setAttribute("font-weight", side === null ? "normal" : "bold");
  }
  function labels(tokens, x, anchor, side) {
    tokens.forEach((t, i) => {
      const label = el("text", {x: x, y: 24 + i * step, "text-anchor": anchor, class: "attn-token", "data-side": side,
                                "data-index": i, text: t}, svg, SVG);
      label.addEventListener("mouseenter", () => focus(side, i, label));
      label.addEventListener("mouseleave", () => focus(null, i, label));
    });
  }
  labels(rows, x0 - 6, "end", "q");
  labels(cols, x1 + 6, "start", "k");
  const legend = el("div", {class: "attn-legend"}, view);
  for (const h of heads) el("span", {style: "color:" + COLOURS[h % COLOURS.length], text: "■ head " + (h + 1) + " "}, legend);
}

function drawHeatmaps(view, rows, cols, w, heads) {
  const cell = Math.max(8, Math.min(22, Math.floor(360 / Math.max(rows.length, cols.length))));
  // hovering a query token dims the other rows of every head's map, which stay drawn (as drawLinks' focus)
  function focus(i) {
    for (const rect of view.querySelectorAll("rect[data-q]")) {
      rect.setAttribute("fill-opacity", i === null || rect.getAttribute("data-q") === String(i) ? 1 : 0.15);
    }
  }
  for (const h of heads) {
    const box = el("figure", {class: "attn-heatmap"}, view);
    el("figcaption", {text: "head " + (h + 1)}, box);
    const left = 8 + 7 * Math.max(...rows.map(t => t.length)), top = 8 + 7 * Math.max(...cols.map(t => t.length));
    const svg = el("svg", {width: left + cols.length * cell + 4, height: top + rows.length * cell + 4}, box, SVG);
    cols.forEach((t, j) => el("text", {x: 0, y: 0, class: "attn-token", "text-anchor": "start",
      transform: `translate(${left + j * cell + cell * 0.7},${top - 4}) rotate(-90)`, text: t}, svg, SVG));
    rows.forEach((t, i) => {
      const label = el("text", {x: left - 4, y: top + i * cell + cell * 0.75, "text-anchor": "end", class: "attn-token",
                                "data-side": "q", "data-index": i, text: t}, svg, SVG);
      label.addEventListener("mouseenter", () => focus(i));
      label.addEventListener("mouseleave", () => focus(null));
    });
    for (let i = 0; i < rows.length; i++) {
      for (let j = 0; j < cols.length; j++) {
        const a = w[h][i][j];
        const shade = Math.round(255 * (1 - a));
        el("rect", {x: left + j * cell, y: top + i * cell, width: cell - 1, height: cell - 1,
                    fill: `rgb(${shade},${shade},255)`, "fill-opacity": 1, "data-weight": a, "data-q": i},
           svg, SVG).appendChild(el("title", {text: `${rows[i]} → ${cols[j]}: ${a.toFixed(3)}`}, null, SVG));
      }
    }
  }
}
