// Score token windows with llama.cpp: the negative log-likelihood of each window's tokens
// 1..T given the tokens before them, from llama.cpp's next-token distributions
// (node-llama-cpp's controlledEvaluate, greedy sampler so the logits reach the softmax
// unchanged). docs/export.md "The llama.cpp check".
//
// Usage: node tools/llama/llama_nll.mjs MODEL.gguf WINDOWS.json OUT.json
//   WINDOWS.json: fp4train eval --windows-out ({"seq_len": T, "windows": [[T + 1 ids], ...]})
//   OUT.json:     {"engine": "llama.cpp ...", "window_nll": [mean nats per token, ...],
//                  "nats_per_token": mean over all windows' tokens, "tokens": n}
import {readFileSync, writeFileSync} from "node:fs";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

function fail(msg) {
  process.stderr.write(`llama_nll: error: ${msg}\n`);
  process.exit(2);
}

const [modelPath, windowsPath, outPath] = process.argv.slice(2);
if (!modelPath || !windowsPath || !outPath) fail("usage: llama_nll.mjs MODEL.gguf WINDOWS.json OUT.json");
let spec;
try {
  spec = JSON.parse(readFileSync(windowsPath, "utf8"));
} catch (e) {
  fail(`cannot read ${windowsPath}: ${e.message}`);
}
if (!Array.isArray(spec.windows) || spec.windows.length === 0) fail(`${windowsPath} has no "windows"`);

// CPU only, prebuilt binaries only (no build at run time), one thread per core.
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath});
const T = spec.windows[0].length;
const context = await model.createContext({contextSize: T, batchSize: T, sequences: 1});
const sequence = context.getSequence();

const windowNll = [];
let total = 0, tokens = 0;
for (const [w, ids] of spec.windows.entries()) {
  if (ids.length !== T) fail(`window ${w} has ${ids.length} tokens, window 0 has ${T}`);
  await sequence.clearHistory();
  // Every position but the last asks for the distribution of the next token.
  const input = ids.slice(0, -1).map((id) => [id, {generateNext: {probabilities: true, options: {temperature: 0}}}]);
  const out = await sequence.controlledEvaluate(input);
  let nll = 0;
  for (let t = 0; t < T - 1; ++t) {
    const p = out[t]?.next?.probabilities?.get(ids[t + 1]);
    if (!(p > 0)) fail(`window ${w} position ${t}: no probability for token ${ids[t + 1]}`);
    nll -= Math.log(p);
  }
  windowNll.push(nll / (T - 1));
  total += nll;
  tokens += T - 1;
}
writeFileSync(outPath, JSON.stringify({
  engine: "llama.cpp (node-llama-cpp 3.21.1, llama.cpp release v0.4.0, CPU)",
  model: modelPath,
  windows: windowNll.length,
  tokens,
  nats_per_token: total / tokens,
  window_nll: windowNll,
}, null, 1) + "\n");
await context.dispose();
await model.dispose();
