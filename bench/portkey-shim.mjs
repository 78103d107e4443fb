// Loaded before Portkey's gateway (node --import) by bench/gateway.py. Under the
// node from Debian (20.x), the gateway forwards a stream as a Response that
// shares the upstream fetch's headers, which are immutable, and its next
// `headers.append` fails every streamed request with a 500. Here fetch returns
// the same response with a mutable copy of its headers; nothing else changes.
const UndiciResponse = globalThis.Response;
const upstreamFetch = globalThis.fetch;
globalThis.fetch = async (...args) => {
  const response = await upstreamFetch(...args);
  return new UndiciResponse(response.body, {
    status: response.status,
    statusText: response.statusText,
    headers: new Headers(response.headers),
  });
};
