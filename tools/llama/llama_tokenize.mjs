// Tokenize texts with a GGUF's vocabulary in llama.cpp (node-llama-cpp's LlamaModel.tokenize,
// no special tokens, no BOS): docs/export.md "The llama.cpp check".
//
// Usage: node tools/llama/llama_tokenize.mjs MODEL.gguf TEXTS.json OUT.json
//   TEXTS.json: {"texts": ["...", ...]}     OUT.json: {"ids": [[...], ...]}
import {readFileSync, writeFileSync} from "node:fs";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const [modelPath, textsPath, outPath] = process.argv.slice(2);
if (!modelPath || !textsPath || !outPath) {
  process.stderr.write("llama_tokenize: error: usage: llama_tokenize.mjs MODEL.gguf TEXTS.json OUT.json\n");
  process.exit(2);
}
const {texts} = JSON.parse(readFileSync(textsPath, "utf8"));
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath, vocabOnly: true});
const ids = texts.map((t) => Array.from(model.tokenize(t, false)));
writeFileSync(outPath, JSON.stringify({engine: "llama.cpp (node-llama-cpp 3.21.1)", ids}) + "\n");
await model.dispose();
