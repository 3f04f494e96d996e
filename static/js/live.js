// The live feed: one websocket with catch-up. It tracks the last event seq it applied,
// reconnects with backoff (asking the server to replay everything after that seq),
// and treats a gap in seq as a lost message: it reconnects, and the replay fills it.

const LABELS = { connecting: "Connecting…", live: "Live", down: "Offline — reconnecting…" };

// `ordered` feeds (one thread) carry one seq sequence; the inbox mixes threads, so it
// does not track seq and relies on the server's inbox.sync after every reconnect. A feed with
// `status: false` (the nav's inbox count) leaves the page's live indicator to the page's own feed.
export function connectFeed({ path, afterSeq = 0, ordered = true, status = true, onEvent, onSync = () => {}, onReconnect = () => {} }) {
  const indicator = status ? document.getElementById("live-status") : null;
  let lastSeq = afterSeq;
  let attempt = 0;
  let socket = null;
  let stopped = false;
  let wasDown = false;

  function show(state) {
    if (!indicator) return;
    indicator.hidden = false;
    indicator.dataset.state = state;
    indicator.textContent = LABELS[state];
  }

  function url() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    return ordered ? `${scheme}://${location.host}${path}?after_seq=${lastSeq}` : `${scheme}://${location.host}${path}`;
  }

  function open() {
    show(attempt === 0 && !wasDown ? "connecting" : "down");
    socket = new WebSocket(url());
    socket.addEventListener("open", () => {
      attempt = 0;
      show("live");
      if (wasDown) onReconnect();
      wasDown = false;
    });
    socket.addEventListener("message", (message) => {
      const event = JSON.parse(message.data);
      if (event.type === "inbox.sync") {
        onSync(event);
        return;
      }
      if (!ordered) {
        onEvent(event);
        return;
      }
      if (typeof event.seq !== "number" || event.seq <= lastSeq) return;
      if (event.seq > lastSeq + 1 && lastSeq > 0) {
        socket.close(); // a gap: reconnect and let the server replay from lastSeq
        return;
      }
      lastSeq = event.seq;
      onEvent(event);
    });
    socket.addEventListener("close", () => {
      if (stopped) return;
      wasDown = true;
      show("down");
      const delay = Math.min(15000, 500 * 2 ** attempt) * (0.75 + Math.random() / 2);
      attempt += 1;
      setTimeout(open, delay);
    });
  }

  open();
  return {
    get lastSeq() {
      return lastSeq;
    },
    close() {
      stopped = true;
      socket?.close();
    },
  };
}

// This very page as the server renders it now (its filters, cursor and all), parsed; null when
// the server does not answer it. A live page takes the regions that changed from it.
export async function fetchThisPage() {
  const response = await fetch(location.href, { headers: { "X-Requested-With": "live" }, cache: "no-store" });
  if (!response.ok) return null;
  return new DOMParser().parseFromString(await response.text(), "text/html");
}
