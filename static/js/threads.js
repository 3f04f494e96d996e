// The thread list, live: when threads it may show have new events, the page fetches itself
// (with its own filters, sort and page) and swaps the counts and the rows, never the filter
// form someone may be typing in. A busy writer makes many rounds a second: at most one fetch
// runs at a time, and the next waits a second after it.
import { connectFeed, fetchThisPage } from "./live.js";

const THROTTLE_MS = 1000;
let running = false;
let again = false;

async function refresh() {
  if (running) {
    again = true;
    return;
  }
  running = true;
  try {
    const page = await fetchThisPage();
    if (!page) return;
    if ("noThreads" in document.body.dataset) {
      // The first thread: the page is the list now, not the how-to-connect card.
      if (!("noThreads" in page.body.dataset)) location.reload();
      return;
    }
    for (const id of ["thread-counts", "thread-results"]) {
      const fresh = page.getElementById(id);
      if (fresh) document.getElementById(id)?.replaceWith(fresh);
    }
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

connectFeed({
  path: "/ws/threads/",
  ordered: false,
  onEvent(event) {
    if (event.type === "threads.changed") refresh();
  },
  onReconnect: refresh, // whatever happened while the link was down
});
