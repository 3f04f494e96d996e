// The thread page, live: new checkpoints and events, status and head appear without a reload.
// The branch tree and chart are folded below the timeline and drawn when first opened.
import { connectFeed, fetchThisPage } from "./live.js";

const body = document.body;
const region = document.getElementById("thread-live");
const onNewestPage = body.hasAttribute("data-newest-page");
let pending = null;

function newest(selector, key) {
  const values = [...document.querySelectorAll(selector)].map((row) => Number(row.dataset[key]));
  return values.length ? Math.max(...values) : 0;
}

// Fetch the drawings (the same page with ?drawings=1) into the folded section, once.
async function drawInto(details) {
  const target = details.querySelector("#drawings-body");
  if (!target || details.dataset.drawn) return;
  details.dataset.drawn = "yes";
  const response = await fetch(details.dataset.src, { headers: { "X-Requested-With": "live" }, cache: "no-store" });
  if (!response.ok) {
    delete details.dataset.drawn;
    return;
  }
  const page = new DOMParser().parseFromString(await response.text(), "text/html");
  const fresh = page.getElementById("drawings-body");
  if (fresh) target.replaceChildren(...fresh.childNodes);
}

function watchDrawings() {
  const details = document.getElementById("drawings");
  if (!details) return;
  if (details.querySelector("#draw-link")) {
    details.addEventListener("toggle", () => {
      if (details.open) drawInto(details);
    });
  } else {
    details.dataset.drawn = "yes"; // drawn by the server (?drawings=1)
  }
}

async function refresh() {
  pending = null;
  const seqBefore = newest("#timeline tr[data-seq]", "seq");
  const eventBefore = newest("#timeline tr[data-event]", "event");
  const drawingsOpen = document.getElementById("drawings")?.open;
  const page = await fetchThisPage();
  if (!page) return;
  const fresh = page.getElementById("thread-live");
  if (!fresh || !region) return;
  region.replaceChildren(...fresh.childNodes);
  for (const row of document.querySelectorAll("#timeline tr[data-seq]")) {
    if (Number(row.dataset.seq) > seqBefore) row.classList.add("fresh");
  }
  for (const row of document.querySelectorAll("#timeline tr[data-event]")) {
    if (Number(row.dataset.event) > eventBefore) row.classList.add("fresh");
  }
  watchDrawings();
  const details = document.getElementById("drawings");
  if (details && drawingsOpen && !details.open) {
    details.open = true; // the reader had it open: keep it open, drawn afresh
  }
}

watchDrawings();

if (body.dataset.thread && region) {
  connectFeed({
    path: `/ws/threads/${body.dataset.thread}/`,
    afterSeq: Number(body.dataset.eventSeq || 0),
    onEvent() {
      if (!onNewestPage) {
        document.getElementById("live-newer").hidden = false; // don't move an older page under the reader
        return;
      }
      // Bursts of checkpoints and events become one refresh.
      pending ??= setTimeout(refresh, 250);
    },
    onReconnect() {
      if (onNewestPage) refresh();
    },
  });
}
