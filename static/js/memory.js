// The memory browser, live: when an item the page shows is written or deleted (by an agent, or a
// person on another page), the page fetches itself and swaps what it shows of items, never a form
// someone may be typing in. On the item page, an edit form opened on an older version says so (the
// server would refuse its save). At most one fetch runs at a time; the next waits a second after it.
import { connectFeed, fetchThisPage } from "./live.js";

const THROTTLE_MS = 1000;
// The regions each page takes from its fresh copy: the item page, then the namespace page.
const REGIONS = [
  "memory-subtitle", "memory-value-card", "memory-history-card", "memory-reads-card", "memory-tree", "memory-results",
];
let running = false;
let again = false;

function warnIfStale() {
  const form = document.getElementById("id_seen_version");
  const shown = document.getElementById("memory-subtitle")?.dataset.version;
  const notice = document.getElementById("edit-stale");
  if (form && notice && shown !== undefined) notice.hidden = form.value === shown;
}

async function refresh() {
  if (running) {
    again = true;
    return;
  }
  running = true;
  try {
    const page = await fetchThisPage();
    if (!page) return;
    for (const id of REGIONS) {
      const fresh = page.getElementById(id);
      if (fresh) document.getElementById(id)?.replaceWith(fresh);
    }
    warnIfStale();
  } finally {
    setTimeout(() => {
      running = false;
      if (again) {
        again = false;
        refresh();
      }
    }, THROTTLE_MS);
  }
}

const live = document.querySelector("[data-memory-live]");
if (live) {
  connectFeed({
    path: `/ws/memory/?${live.dataset.memoryLive}`,
    ordered: false,
    onEvent: refresh, // the server sends only changes of what this page shows
    onReconnect: refresh, // whatever happened while the link was down
  });
}
