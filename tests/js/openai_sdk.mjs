// The official openai npm package against a live Sluice gateway: list the models, then
// stream a chat. Prints one JSON line for tests/clients/test_js_sdk.py to check.
//
//   node tests/js/openai_sdk.mjs http://127.0.0.1:8000/v1 smollm2-135m-instruct "Name three colours."
import OpenAI from "openai";

const [baseURL, model, prompt] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: process.env.SLUICE_API_KEY || "unused", maxRetries: 0, timeout: 120_000 });

const models = [];
for await (const card of client.models.list()) models.push(card.id);

const { data: stream, response } = await client.chat.completions
  .create({
    model,
    messages: [{ role: "user", content: prompt }],
    stream: true,
    stream_options: { include_usage: true },
    temperature: 0,
    max_tokens: 12,
  })
  .withResponse();

let text = "";
let contentChunks = 0;
let usage = null;
for await (const chunk of stream) {
  const piece = chunk.choices?.[0]?.delta?.content;
  if (piece) {
    text += piece;
    contentChunks++;
  }
  if (chunk.usage) usage = chunk.usage;
}
console.log(JSON.stringify({ models, text, contentChunks, usage, worker: response.headers.get("x-sluice-worker") }));
