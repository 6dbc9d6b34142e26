// aiayn explorer: the page asks the server for every number and draws it with Plotly.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { models: {}, view: null, pending: 0, asked: 0 };
window.explorer = state; // for the end-to-end test and curious readers

async function api(path, body) {
  const response = await fetch(path, {
    method: body === undefined ? "GET" : "POST",
    headers: { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const data = await response.json();
  if (!response.ok) throw new Error(data.error || response.statusText);
  return data;
}

function debounce(fn, ms) {
  let timer;
  return (...args) => { clearTimeout(timer); timer = setTimeout(() => fn(...args), ms); };
}

function showError(err) { $("error").textContent = err ? String(err.message || err) : ""; }

function shown(token) {
  // Plotly reads tick labels as HTML: escape < > & so "<s>" shows as itself.
  const map = { " ": "·", "\u0120": "·", "\n": "\\n", "\u010a": "\\n", "\t": "\\t",
    "<": "&lt;", ">": "&gt;", "&": "&amp;" };
  return Array.from(token).map((c) => map[c] ?? c).join("") || "∅";
}

function fillSelect(select, options, selected) {
  select.innerHTML = "";
  for (const [value, label] of options) {
    const option = document.createElement("option");
    option.value = value;
    option.textContent = label;
    select.appendChild(option);
  }
  if (selected !== undefined) select.value = String(selected);
}

// ----- the model view ------------------------------------------------------------------------

function streamsOf(model) {
  if (model.arch === "encoder-decoder") return ["encoder", "decoder", "cross"];
  return [model.arch === "encoder" ? "encoder" : "self"];
}

function onModelChange() {
  const model = state.models[$("model").value];
  // Start each model on a sentence in the language it reads, unless the reader typed one.
  const examples = Object.values(state.models).map((m) => m.example);
  if (!$("text").value.trim() || examples.includes($("text").value)) {
    $("text").value = model.example;
    $("target").value = "";
  }
  $("model-info").textContent =
    `${model.kind}, ${model.arch}, ${model.n_layers} layers, ${model.n_heads} heads, ` +
    `d_model ${model.d_model}, context ${model.max_len}, ` +
    `${(model.parameters / 1e6).toFixed(1)}M parameters`;
  const streams = streamsOf(model);
  const names = { self: "masked self-attention", encoder: "encoder self-attention",
    decoder: "decoder masked self-attention", cross: "cross-attention (alignment)" };
  fillSelect($("stream"), streams.map((s) => [s, names[s]]),
    model.arch === "encoder-decoder" ? "cross" : streams[0]);
  fillSelect($("head"), [["mean", "mean of heads"],
    ...Array.from({ length: model.n_heads }, (_, h) => [h, `head ${h}`])], "mean");
  $("translate-controls").hidden = model.arch !== "encoder-decoder";
  $("next-token-panel").hidden = model.arch !== "decoder";
  // An image model: a test image and where its [CLS] token looks, in place of the text.
  for (const id of ["image-controls", "image-plots"]) $(id).hidden = !model.image;
  for (const id of ["text-controls", "text-plots"]) $(id).hidden = model.image;
  $("stream").disabled = $("causal").disabled = $("temperature").disabled = model.image;
  if (model.image) {
    fillSelect($("stream"), [["encoder", "[CLS] over the patches"]], "encoder");
    fillSelect($("layer"), Array.from({ length: model.n_layers }, (_, l) => [l, `layer ${l}`]),
      model.n_layers - 1);
    refreshImage();
    return;
  }
  onStreamChange();
}

async function refreshImage() {
  const model = state.models[$("model").value];
  if (!model.image) return;
  try {
    const r = await api("/api/image", { model: model.name, index: Number($("image-index").value),
      head: $("head").value === "mean" ? null : Number($("head").value) });
    const layer = Math.min(Number($("layer").value) || 0, r.cls_attention.length - 1);
    $("image-info").textContent = `image ${r.index} of ${r.images}: true ${r.true}, ` +
      `predicted ${r.predicted} (p = ${f(Math.max(...r.probs))})`;
    const square = { yaxis: { autorange: "reversed", scaleanchor: "x" }, margin: { t: 40 } };
    Plotly.react("image-picture", [{ type: "heatmap", z: r.pixels, colorscale: "Greys",
      showscale: false }], { ...square, title: { text: "the image", font: { size: 14 } } },
    { displayModeBar: false, responsive: true });
    Plotly.react("image-attention", [{ type: "heatmap", z: r.cls_attention[layer],
      colorscale: "Inferno", zmin: 0,
      hovertemplate: "patch (%{y}, %{x}): %{z:.4f}<extra></extra>" }],
    { ...square, title: { text: `layer ${layer}: [CLS] → patches`, font: { size: 14 } } },
    { displayModeBar: false, responsive: true });
    showError(null);
  } catch (err) {
    showError(err);
  }
}

function onStreamChange() {
  const model = state.models[$("model").value];
  const stream = $("stream").value;
  const n = stream === "decoder" || stream === "cross" ? model.n_decoder_layers : model.n_layers;
  // Cross-attention aligns best in the top layers: start there.
  const keep = stream === "cross" ? n - 1 : Math.min(Number($("layer").value) || 0, n - 1);
  fillSelect($("layer"), Array.from({ length: n }, (_, l) => [l, `layer ${l}`]), keep);
  $("causal").disabled = stream === "cross";
  $("causal").checked = stream === "self" || stream === "decoder";
  refresh();
}

function drawRow(i) {
  const view = state.view;
  if (!view || i < 0 || i >= view.rows.length) return;
  const weights = view.weights[i].map((w) => (w === null ? 0 : w));
  Plotly.react("row", [{
    type: "bar", x: view.cols.map((_, j) => j), y: weights,
    hovertemplate: "%{customdata}: %{y:.4f}<extra></extra>",
    customdata: view.cols.map(shown), marker: { color: "#3b6fb6" },
  }], {
    title: { text: `query ${i} "${shown(view.rows[i])}" attends to`, font: { size: 14 } },
    xaxis: { tickvals: view.cols.map((_, j) => j), ticktext: view.cols.map(shown) },
    yaxis: { range: [0, 1], title: { text: "weight" } }, margin: { t: 40, b: 60 },
  }, { displayModeBar: false, responsive: true });
}

function drawHeatmap(view) {
  const rows = view.rows.map(shown);
  const cols = view.cols.map(shown);
  const heatmap = $("heatmap");
  Plotly.react(heatmap, [{
    type: "heatmap", z: view.weights, zmin: 0, zmax: 1, colorscale: "Viridis",
    x: cols.map((_, j) => j), y: rows.map((_, i) => i), hoverongaps: false,
    customdata: view.weights.map((row, i) => row.map((_, j) => [rows[i], cols[j]])),
    hovertemplate: "query %{customdata[0]} → key %{customdata[1]}: %{z:.4f}<extra></extra>",
  }], {
    title: { text: `${$("stream").selectedOptions[0].textContent}, layer ${view.layer}, ` +
      (view.head === null ? "mean of heads" : `head ${view.head}`) +
      `, T = ${view.temperature}`, font: { size: 14 } },
    xaxis: { tickvals: cols.map((_, j) => j), ticktext: cols, side: "top" },
    yaxis: { tickvals: rows.map((_, i) => i), ticktext: rows, autorange: "reversed",
      title: { text: "query" } },
    margin: { t: 90, l: 70 },
  }, { displayModeBar: false, responsive: true });
  if (!heatmap.dataset.hover) {
    heatmap.on("plotly_hover", (event) => {
      $("row").dataset.query = event.points[0].y;
      drawRow(event.points[0].y);
    });
    heatmap.dataset.hover = "1";
  }
  drawRow(Math.min(view.rows.length - 1, Number($("row").dataset.query || 0)));
}

async function refreshAttention() {
  const text = $("text").value;
  const model = state.models[$("model").value];
  if (!text.trim() || model.image) return;
  const body = {
    model: model.name, text, stream: $("stream").value, layer: Number($("layer").value),
    head: $("head").value === "mean" ? null : Number($("head").value),
    temperature: Number($("temperature").value),
  };
  if (!$("causal").disabled) body.causal = $("causal").checked;
  if (model.arch === "encoder-decoder" && $("target").value.trim()) body.target = $("target").value;
  state.pending += 1;
  const ask = ++state.asked; // answers may come back out of order: draw only the newest
  try {
    const view = await api("/api/attention", body);
    if (ask !== state.asked) return;
    state.view = view;
    drawHeatmap(view);
    if (model.arch === "encoder-decoder" && !$("target").value.trim() && view.target) {
      // No target typed: the server read the model's own translation; say which.
      $("target").placeholder = `empty: reading the model's translation, "${view.target}"`;
    }
    showError(null);
  } catch (err) {
    showError(err);
  } finally {
    state.pending -= 1;
  }
}

async function refreshNextToken() {
  const model = state.models[$("model").value];
  if (model.arch !== "decoder" || !$("text").value.trim()) return;
  try {
    const next = await api("/api/next-token", {
      model: model.name, text: $("text").value, temperature: Number($("sample-temperature").value),
    });
    $("next-entropy").textContent = `entropy ${next.entropy.toFixed(3)} nats`;
    Plotly.react("next-token", [{
      type: "bar", orientation: "h", y: next.tokens.map((t) => `"${shown(t)}"`).reverse(),
      x: next.probs.slice().reverse(), hovertemplate: "%{y}: %{x:.4f}<extra></extra>",
      marker: { color: "#d08c2c" },
    }], { xaxis: { range: [0, 1], title: { text: "probability" } }, margin: { t: 10, l: 80 } },
    { displayModeBar: false, responsive: true });
  } catch (err) {
    showError(err);
  }
}

function refresh() {
  refreshAttention();
  refreshNextToken();
}

async function translate() {
  const model = state.models[$("model").value];
  try {
    const out = await api("/api/translate", { model: model.name, text: $("text").value });
    $("target").value = out.translation;
    refresh();
  } catch (err) {
    showError(err);
  }
}

// ----- lessons -------------------------------------------------------------------------------

const f = (x) => Number(x).toFixed(3);

async function lessonQuery() {
  const r = await api("/api/lesson/query",
    { query: Number($("lesson-query").value), scale: $("lesson-scale").checked });
  const head = `<tr><th>token</th>${r.features.map((n) => `<th>key: ${n}</th>`).join("")}` +
    `<th>score q·k</th><th>${r.divisor === 1 ? "unscaled" : `÷ √${r.d} = ${r.divisor}`}</th>` +
    "<th>softmax weight</th></tr>";
  const body = r.tokens.map((t, i) => `<tr class="${i === r.query_index ? "query" : ""}">` +
    `<td>${t}</td>${r.keys[i].map((k) => `<td>${k}</td>`).join("")}<td>${f(r.scores[i])}</td>` +
    `<td>${f(r.scaled[i])}</td><td>${f(r.weights[i])}</td></tr>`).join("");
  $("lesson-steps").innerHTML = head + body;
  $("lesson-output").innerHTML = `query of "<b>${r.query_token}</b>" = (${r.query.join(", ")});` +
    " output = Σ weight × value = (" +
    r.output.map((v, i) => `${r.features[i]} ${f(v)}`).join(", ") + ")";
  Plotly.react("lesson-weights", [{
    type: "bar", x: r.tokens.map((t, i) => `${i}:${t}`), y: r.weights, marker: { color: "#3b6fb6" },
  }], { yaxis: { range: [0, 1], title: { text: "weight" } }, margin: { t: 10 } },
  { displayModeBar: false, responsive: true });
}

async function lessonLookup() {
  const r = await api("/api/lesson/lookup", {
    between: Number($("lookup-between").value), length: Number($("lookup-length").value),
  });
  $("lookup-output").textContent = `query (${r.query.map(f).join(", ")}): weights ` +
    `${r.weights.map(f).join(" / ")}, output (${r.output.map(f).join(", ")}), ` +
    `entropy ${f(r.entropy)} nats`;
  Plotly.react("lookup-chart", [{
    type: "bar", x: ["first key", "second key"], y: r.weights, marker: { color: "#5a9e6f" },
  }], { yaxis: { range: [0, 1], title: { text: "weight" } }, margin: { t: 10 } },
  { displayModeBar: false, responsive: true });
}

async function lessonKernel() {
  const sigma = Number(Math.pow(10, Number($("kernel-sigma").value)).toFixed(3));
  $("kernel-sigma-value").textContent = sigma;
  const r = await api("/api/lesson/kernel", { sigma });
  $("kernel-output").textContent = `σ = ${sigma}: error against sin x ${f(r.mse_vs_truth)}; ` +
    `the query at x = ${r.query} spreads its weights with entropy ${f(r.query_entropy)} nats; ` +
    `attention and the kernel formula differ by ${r.max_difference_formula_vs_attention.toExponential(1)}`;
  Plotly.react("kernel-chart", [
    { type: "scatter", mode: "markers", x: r.x_train, y: r.y_train, name: "samples",
      marker: { color: "#222", size: 5 } },
    { type: "scatter", mode: "lines", x: r.grid, y: r.truth, name: "sin x",
      line: { dash: "dot", color: "#999" } },
    { type: "scatter", mode: "lines", x: r.grid, y: r.estimate, name: "attention output",
      line: { color: "#3b6fb6", width: 3 } },
    { type: "bar", x: r.x_train, y: r.query_weights, name: `weights of x = ${r.query}`,
      yaxis: "y2", marker: { color: "#e08a3c" }, opacity: 0.6, width: 0.08 },
  ], { margin: { t: 10 }, yaxis2: { overlaying: "y", side: "right", range: [0, 1],
    title: { text: "weight" } }, legend: { orientation: "h" } },
  { displayModeBar: false, responsive: true });
}

async function lessonPositions() {
  const position = Number($("pe-position").value);
  $("pe-position-value").textContent = position;
  const r = await api("/api/lesson/positions", { position, max_len: 100,
    d_model: Number($("pe-dmodel").value) });
  Plotly.react("pe-chart", [{ type: "scatter", mode: "lines", y: r.similarity,
    x: r.similarity.map((_, i) => i) }], {
    xaxis: { title: { text: "position q" } }, yaxis: { title: { text: "PE(p)·PE(q)" } },
    shapes: [{ type: "line", x0: position, x1: position, yref: "paper", y0: 0, y1: 1,
      line: { color: "#c03", dash: "dash" } }], margin: { t: 10 },
  }, { displayModeBar: false, responsive: true });
}

async function kvCache() {
  const body = { preset: $("kv-preset").value, context: Number($("kv-context").value),
    batch: Number($("kv-batch").value), dtype: $("kv-dtype").value, mixer: $("kv-mixer").value };
  if ($("kv-every").value) body.attention_every = Number($("kv-every").value);
  for (const [id, field] of [["kv-layers", "n_layers"], ["kv-dmodel", "d_model"],
    ["kv-heads", "n_heads"], ["kv-kvheads", "n_kv_heads"]]) {
    if ($(id).value) body[field] = Number($(id).value);
  }
  try {
    const r = await api("/api/lesson/kv-cache", body);
    $("kv-summary").textContent = r.arch === "encoder" ? "encoder-only: no KV cache" :
      `KV cache ${r.kv_cache} (${r.kv_cache_per_token} per token` +
      (r.recurrent_state_bytes ? `, of which fixed states ${r.recurrent_state}` : "") +
      `); weights ${r.weights}; ${r.flops_per_token} per token forward`;
    $("kv-result").textContent = r.text;
  } catch (err) {
    $("kv-summary").textContent = String(err.message || err);
    $("kv-result").textContent = "";
  }
}

// ----- wiring --------------------------------------------------------------------------------

async function start() {
  const info = await api("/api/models");
  for (const m of info.models) state.models[m.name] = m;
  fillSelect($("model"), info.models.map((m) => [m.name, m.name]));
  $("text").maxLength = info.max_chars;
  fillSelect($("lesson-query"), info.lesson_tokens.map((t, i) => [i, `${i}: ${t}`]), 7);
  fillSelect($("kv-preset"), info.presets.map((p) => [p, p]), "gpt2-small");

  const later = debounce(refresh, 250);
  $("model").addEventListener("change", onModelChange);
  $("stream").addEventListener("change", onStreamChange);
  // Layer, head, mask and temperature change only the attention view: no next-token request.
  for (const id of ["layer", "head", "causal"]) {
    $(id).addEventListener("change", refreshAttention);
  }
  $("text").addEventListener("input", later);
  $("text").addEventListener("keydown", (e) => { if (e.key === "Enter") refresh(); });
  $("target").addEventListener("input", later);
  $("show").addEventListener("click", refresh);
  $("translate").addEventListener("click", translate);
  $("temperature").addEventListener("input", debounce(() => {
    $("temperature-value").textContent = Number($("temperature").value).toFixed(2);
    refreshAttention();
  }, 60));
  $("sample-temperature").addEventListener("input", debounce(() => {
    $("sample-temperature-value").textContent = Number($("sample-temperature").value).toFixed(2);
    refreshNextToken();
  }, 60));

  $("image-index").addEventListener("input", debounce(refreshImage, 100));
  for (const id of ["layer", "head"]) {
    $(id).addEventListener("change", () => { if (state.models[$("model").value].image) refreshImage(); });
  }
  $("lesson-query").addEventListener("change", lessonQuery);
  $("lesson-scale").addEventListener("change", lessonQuery);
  for (const id of ["lookup-between", "lookup-length"]) {
    $(id).addEventListener("input", debounce(lessonLookup, 40));
  }
  $("kernel-sigma").addEventListener("input", debounce(lessonKernel, 60));
  $("pe-position").addEventListener("input", debounce(lessonPositions, 40));
  $("pe-dmodel").addEventListener("change", lessonPositions);
  for (const id of ["kv-preset", "kv-layers", "kv-dmodel", "kv-heads", "kv-kvheads",
    "kv-context", "kv-batch", "kv-dtype", "kv-mixer", "kv-every"]) {
    $(id).addEventListener("input", debounce(kvCache, 150));
  }

  onModelChange();
  await Promise.all([lessonQuery(), lessonLookup(), lessonKernel(), lessonPositions(), kvCache()]);
  document.body.dataset.ready = "1";
}

start().catch(showError);
