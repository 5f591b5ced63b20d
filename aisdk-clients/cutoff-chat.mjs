// A chat client that reads an answer the gateway cut off for a tenant's token budget, and
// prints what the chat shows: the text that passed, and the error with its message.
//
//   node cutoff-chat.mjs ai4 <api url> <assistant key> <fp> <question>
//   node cutoff-chat.mjs <ai5|ai7> <api url> <assistant key> <fp> <question>
//
// ai4 runs callChatApi on the v1 data stream, as useChat does: an error part ends the answer
// with an Error whose message useChat shows. ai5 and ai7 run the SDK's own chat
// (AbstractChat, which useChat wraps) with DefaultChatTransport on the v2 UI message stream,
// over a minimal in-memory state: its status, error and onFinish flags (isError,
// isDisconnect, isAbort) are what a chat UI reads. It prints one JSON object.
const [pkg, api, key, fp, question] = process.argv.slice(2);
const out = {};

if (pkg === 'ai4') {
  const { callChatApi } = await import('@ai-sdk/ui-utils');
  const message = {
    id: 'u1', createdAt: new Date(), role: 'user', content: question,
    parts: [{ type: 'text', text: question }],
  };
  try {
    await callChatApi({
      api,
      body: { id: 'chat-1', messages: [message], fp },
      streamProtocol: 'data',
      headers: { Authorization: `Bearer ${key}` },
      abortController: () => new AbortController(),
      restoreMessagesOnFailure: () => {},
      onResponse: (res) => { out.status = res.status; },
      onUpdate: ({ message: m }) => { out.text = m.content; },
      onFinish: (_, { finishReason }) => { out.finishReason = finishReason; },
      generateId: () => 'a1',
      lastMessage: message,
    });
  } catch (e) {
    out.error = { name: e.name, message: e.message, network: e instanceof TypeError };
  }
} else {
  const { AbstractChat, DefaultChatTransport } = await import(pkg);
  const state = {
    status: 'ready', error: undefined, messages: [],
    pushMessage(m) { this.messages = [...this.messages, m]; },
    popMessage() { this.messages = this.messages.slice(0, -1); },
    replaceMessage(i, m) { this.messages = this.messages.map((x, j) => (j === i ? m : x)); },
    snapshot: (x) => structuredClone(x),
  };
  let finished;
  const chat = new AbstractChat({
    id: 'chat-1',
    state,
    transport: new DefaultChatTransport({
      api,
      headers: { Authorization: `Bearer ${key}` },
      body: { fp },
      fetch: async (url, init) => {
        const res = await fetch(url, init);
        out.status = res.status;
        return res;
      },
    }),
    onFinish: (o) => { finished = o; },
  });
  await chat.sendMessage({ text: question });
  const answer = state.messages.at(-1);
  out.chatStatus = state.status;
  if (state.error) out.error = { name: state.error.name, message: state.error.message, network: state.error instanceof TypeError };
  if (answer && answer.role === 'assistant') {
    out.text = answer.parts.filter((p) => p.type === 'text').map((p) => p.text).join('');
    out.metadata = answer.metadata ?? null;
  }
  if (finished) {
    out.isError = finished.isError;
    out.isDisconnect = finished.isDisconnect;
    out.isAbort = finished.isAbort;
  }
}
console.log(JSON.stringify(out));
