// Greedy continuation in llama.cpp of prompts given as token ids, with the margin of every
// choice, to compare with `fp4train sample --temperature 0 --ids-out` (docs/export.md "The
// llama.cpp check"): at each step the next token is the most probable one of llama.cpp's full
// next-token distribution (the lowest id among equals, as fp4train's first maximum), and p1 -
// p2, the gap to the runner-up, says how close a tie was.
//
// Usage: node tools/llama/llama_greedy.mjs MODEL.gguf IDS.json TOKENS OUT.json
//   IDS.json: [{"prompt": [ids...]}, ...] (fp4train sample --ids-out objects; "continuation"
//             is ignored); TOKENS: tokens to generate; generation stops after an EOS (id 2).
//   OUT.json: [{"continuation": [ids...], "margin": [p1 - p2 at each step]}, ...]
import {readFileSync, writeFileSync} from "node:fs";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const EOS = 2;

function fail(msg) {
  process.stderr.write(`llama_greedy: error: ${msg}\n`);
  process.exit(2);
}

const [modelPath, idsPath, tokensArg, outPath] = process.argv.slice(2);
const tokens = Number(tokensArg);
if (!modelPath || !idsPath || !outPath || !(tokens >= 1))
  fail("usage: llama_greedy.mjs MODEL.gguf IDS.json TOKENS OUT.json");
let prompts;
try {
  prompts = JSON.parse(readFileSync(idsPath, "utf8"));
} catch (e) {
  fail(`cannot read ${idsPath}: ${e.message}`);
}
if (!Array.isArray(prompts) || prompts.length === 0) fail(`${idsPath} is not a list of prompts`);

// The most probable token of a distribution (Map id -> p) and its gap to the runner-up.
function greedy(probabilities) {
  let best = -1, p1 = -1, p2 = -1;
  for (const [id, p] of probabilities) {
    if (p > p1 || (p === p1 && id < best)) {
      p2 = p1;
      best = id, p1 = p;
    } else if (p > p2) {
      p2 = p;
    }
  }
  return {best, margin: p1 - Math.max(p2, 0)};
}

const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath});
const longest = Math.max(...prompts.map((p) => p.prompt.length)) + tokens;
const context = await model.createContext({contextSize: longest, batchSize: longest, sequences: 1});
const sequence = context.getSequence();
const ask = {generateNext: {probabilities: true, options: {temperature: 0}}};

const results = [];
for (const [i, {prompt}] of prompts.entries()) {
  if (!Array.isArray(prompt) || prompt.length === 0) fail(`prompt ${i} has no "prompt" ids`);
  await sequence.clearHistory();
  let out = await sequence.controlledEvaluate(prompt.map((id, t) => (t === prompt.length - 1 ? [id, ask] : id)));
  const continuation = [], margin = [];
  for (;;) {
    const dist = out[out.length - 1]?.next?.probabilities;
    if (!dist) fail(`prompt ${i}, step ${continuation.length}: no distribution`);
    const {best, margin: m} = greedy(dist);
    continuation.push(best), margin.push(m);
    if (continuation.length >= tokens || best === EOS) break;
    out = await sequence.controlledEvaluate([[best, ask]]);
  }
  results.push({continuation, margin});
}
writeFileSync(outPath, JSON.stringify(results) + "\n");
await context.dispose();
await model.dispose();
