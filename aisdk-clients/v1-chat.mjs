// A chat client of AI SDK 4, as useChat runs one: callChatApi (the function useChat calls)
// posts the conversation with the extra message fields and the platform's fields, and reads
// the v4 data stream. The thread comes in the X-Thread-Id header: SDK 4 does not pass the
// finish part's own threadId to the application.
//
//   node v1-chat.mjs <api url> <assistant key> <fp> <question>
//
// It prints one JSON object on standard output and exits non-zero on any error.
import { callChatApi } from '@ai-sdk/ui-utils';

const [api, key, fp, question] = process.argv.slice(2);
const message = {
  id: 'u1',
  createdAt: new Date(),
  role: 'user',
  content: question,
  parts: [{ type: 'text', text: question }],
};
const out = {};
await callChatApi({
  api,
  body: { id: 'chat-1', messages: [message], fp },
  streamProtocol: 'data',
  headers: { Authorization: `Bearer ${key}` },
  abortController: () => new AbortController(),
  restoreMessagesOnFailure: () => {},
  onResponse: (res) => {
    out.status = res.status;
    out.threadHeader = res.headers.get('x-thread-id');
    // The header's value is the data stream protocol's version ("v1").
    out.dataStreamHeader = res.headers.get('x-vercel-ai-data-stream');
  },
  onUpdate: () => {},
  onFinish: (msg, { usage, finishReason }) => {
    out.text = msg.content;
    out.finishReason = finishReason;
    out.usage = usage;
  },
  generateId: () => 'a1',
  lastMessage: message,
});
if (out.finishReason === undefined) throw new Error('no finish part was read');
console.log(JSON.stringify(out));
