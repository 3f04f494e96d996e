// The thread page, live: new checkpoints, status and head appear without a reload.
import { connectFeed, fetchThisPage } from "./live.js";

const body = document.body;
const region = document.getElementById("thread-live");
const onNewestPage = body.hasAttribute("data-newest-page");
let pending = null;

function newestSeq() {
  const seqs = [...document.querySelectorAll("#timeline tr[data-seq]")].map((row) => Number(row.dataset.seq));
  return seqs.length ? Math.max(...seqs) : 0;
}

async function refresh() {
  pending = null;
  const before = newestSeq();
  const page = await fetchThisPage();
  if (!page) return;
  const fresh = page.getElementById("thread-live");
  if (!fresh || !region) return;
  region.replaceChildren(...fresh.childNodes);
  for (const row of document.querySelectorAll("#timeline tr[data-seq]")) {
    if (Number(row.dataset.seq) > before) row.classList.add("fresh");
  }
}

if (body.dataset.thread && region) {
  connectFeed({
    path: `/ws/threads/${body.dataset.thread}/`,
    afterSeq: Number(body.dataset.eventSeq || 0),
    onEvent() {
      if (!onNewestPage) {
        document.getElementById("live-newer").hidden = false; // don't move an older page under the reader
        return;
      }
      // Bursts of checkpoints become one refresh.
      pending ??= setTimeout(refresh, 250);
    },
    onReconnect() {
      if (onNewestPage) refresh();
    },
  });
}
