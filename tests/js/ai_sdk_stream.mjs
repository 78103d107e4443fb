// Stream one chat completion through the AI SDK and print what it read, as JSON.
//
// Usage: node ai_sdk_stream.mjs BASE_URL MODEL PROMPT MAX_TOKENS
// Prints {"text", "parts", "finishReason", "usage"} on one line; exits 1 on an
// error part or a failed stream.
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { streamText } from "ai";

const [baseURL, model, prompt, maxTokens] = process.argv.slice(2);
const provider = createOpenAICompatible({
  name: "sluicegate",
  baseURL,
  apiKey: "unused",
  includeUsage: true,
});
const result = streamText({
  model: provider(model),
  prompt,
  maxOutputTokens: Number(maxTokens),
  temperature: 0,
  maxRetries: 0,
});
let parts = 0;
let text = "";
for await (const part of result.fullStream) {
  if (part.type === "error") {
    console.error(String(part.error));
    process.exit(1);
  }
  if (part.type === "text-delta") {
    parts += 1;
    text += part.text;
  }
}
const usage = await result.usage;
console.log(
  JSON.stringify({
    text,
    parts,
    finishReason: await result.finishReason,
    usage: { inputTokens: usage.inputTokens, outputTokens: usage.outputTokens },
  }),
);
