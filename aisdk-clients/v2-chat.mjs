// A chat client of AI SDK 5 or later, as a documentation site builds one: DefaultChatTransport
// posts the conversation (with the platform's fields in `body`), readUIMessageStream turns the
// UI message stream into the assistant's message, whose metadata carries what the finish
// chunk's messageMetadata said (threadId, usage).
//
//   node v2-chat.mjs <package: ai5|ai7> <api url> <assistant key> <fp> <question> [<follow-up>]
//
// With a follow-up it sends a second turn: the whole conversation (the first answer as
// readUIMessageStream built it) and the threadId from the first answer's metadata. It prints
// one JSON object per turn on standard output and exits non-zero on any error.
const [pkg, api, key, fp, question, followUp] = process.argv.slice(2);
const { DefaultChatTransport, readUIMessageStream } = await import(pkg);

async function turn(messages, threadId) {
  const seen = {};
  const transport = new DefaultChatTransport({
    api,
    headers: { Authorization: `Bearer ${key}` },
    body: threadId ? { fp, threadId } : { fp },
    // Record the response's headers on the way (the transport does not expose them).
    fetch: async (url, init) => {
      const res = await fetch(url, init);
      seen.status = res.status;
      seen.threadHeader = res.headers.get('x-thread-id');
      // The header's value is the UI message stream protocol's version ("v1"), not the route's.
      seen.uiMessageStreamHeader = res.headers.get('x-vercel-ai-ui-message-stream');
      return res;
    },
  });
  const chunks = await transport.sendMessages({
    chatId: 'chat-1',
    trigger: 'submit-message',
    messageId: undefined,
    abortSignal: undefined,
    messages,
  });
  const types = [];
  const tapped = chunks.pipeThrough(new TransformStream({
    transform(chunk, controller) {
      types.push(chunk.type);
      controller.enqueue(chunk);
    },
  }));
  let message;
  for await (const m of readUIMessageStream({ stream: tapped, onError: (e) => { throw e; } })) {
    message = m;
  }
  if (!message) throw new Error('no message was read');
  const text = message.parts.filter((p) => p.type === 'text').map((p) => p.text).join('');
  return { ...seen, text, metadata: message.metadata ?? null, chunkTypes: types, message };
}

const first = [{ id: 'u1', role: 'user', parts: [{ type: 'text', text: question }] }];
const a = await turn(first);
const { message: answer, ...out } = a;
console.log(JSON.stringify(out));
if (followUp) {
  const second = [...first, answer, { id: 'u2', role: 'user', parts: [{ type: 'text', text: followUp }] }];
  const { message: _, ...out2 } = await turn(second, a.metadata?.threadId);
  console.log(JSON.stringify(out2));
}
