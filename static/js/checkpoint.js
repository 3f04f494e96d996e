// Checkpoint page: j / k step to the next / previous checkpoint, the raw-JSON toggle,
// expand / collapse all, the state tree's keyboard and copy buttons (json_tree.js), and following
// the thread live.
import { navigableTree } from "./json_tree.js";
import { connectFeed, fetchThisPage } from "./live.js";

const RAW_KEY = "quicksave.checkpoint.raw";

function isTyping(element) {
  return element instanceof HTMLElement &&
    (element.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(element.tagName));
}

document.addEventListener("keydown", (event) => {
  if (event.defaultPrevented || event.ctrlKey || event.metaKey || event.altKey || isTyping(event.target)) {
    return;
  }
  const rel = { j: "next", k: "prev" }[event.key];
  const link = rel && document.querySelector(`a[rel="${rel}"]`);
  if (link) {
    event.preventDefault();
    window.location.assign(link.href);
  }
});

// Storage can be blocked (privacy settings, sandboxed frames): remembering the view is a nicety.
function remember(value) {
  try { window.sessionStorage.setItem(RAW_KEY, value ? "1" : ""); } catch { /* not remembered */ }
}
function remembered() {
  try { return window.sessionStorage.getItem(RAW_KEY) === "1"; } catch { return false; }
}

const toggle = document.getElementById("toggle-raw");
const tree = document.getElementById("state-tree");
navigableTree(tree);
const raw = document.getElementById("raw-json");

function showRaw(on) {
  if (!toggle || !tree || !raw) return;
  toggle.setAttribute("aria-pressed", String(on));
  toggle.textContent = on ? "Show tree" : "Show raw JSON";
  tree.hidden = on;
  raw.hidden = !on;
  for (const id of ["expand-all", "collapse-all"]) {
    const button = document.getElementById(id);
    if (button) button.hidden = on;
  }
}

if (toggle) {
  toggle.addEventListener("click", () => {
    const on = toggle.getAttribute("aria-pressed") !== "true";
    showRaw(on);
    remember(on);
  });
  // Keep the reader's choice while stepping through checkpoints with j / k.
  if (remembered()) showRaw(true);
}

function setAllOpen(open) {
  if (!tree) return;
  for (const details of tree.querySelectorAll("details")) details.open = open;
}
document.getElementById("expand-all")?.addEventListener("click", () => setAllOpen(true));
document.getElementById("collapse-all")?.addEventListener("click", () => setAllOpen(false));

// Live: a later checkpoint on this branch, an approval asked or decided, or a compaction refetches
// the page and swaps only what those change. The state tree, the fork form and anything the
// reader may be typing in stay as they are.
const LIVE_REGIONS = ["step-nav", "newer-checkpoints", "checkpoint-attention"];
const here = document.body.dataset;
let newer = false; // the feed told of a later checkpoint on this branch: show the notice
let timer = null;
let fetching = false;
let queued = false;

function swap(id, page) {
  const region = document.getElementById(id);
  const fresh = page.getElementById(id);
  if (!region || !fresh) return;
  const before = [...region.children];
  const after = [...fresh.children];
  if (before.length !== after.length) {
    region.replaceChildren(...fresh.childNodes);
    return;
  }
  // Element by element: a link that did not change keeps its place and the keyboard focus.
  before.forEach((element, i) => {
    if (element.isEqualNode(after[i])) return;
    element.replaceWith(after[i]);
    after[i].classList.add("fresh");
    setTimeout(() => after[i].classList.remove("fresh"), 2500); // the glow's length in checkpoint.css
  });
}

async function refresh() {
  const page = await fetchThisPage();
  if (!page) return; // e.g. compaction removed this checkpoint: keep what is shown
  if (newer) page.querySelector("#newer-checkpoints .newer")?.removeAttribute("hidden");
  for (const id of LIVE_REGIONS) swap(id, page);
}

// At most one refetch in flight and one queued; a burst of events becomes one refetch.
function schedule() {
  if (timer) return; // about to refetch: that one sees this event too
  if (fetching) {
    queued = true;
    return;
  }
  timer = setTimeout(async () => {
    timer = null;
    fetching = true;
    try {
      await refresh();
    } catch {
      /* offline: the feed reconnects and refetches */
    } finally {
      fetching = false;
      if (queued) {
        queued = false;
        schedule();
      }
    }
  }, 250);
}

if (here.thread) {
  connectFeed({
    path: `/ws/threads/${here.thread}/`,
    afterSeq: Number(here.eventSeq || 0),
    onEvent({ type, data = {} }) {
      if (type === "checkpoint.created") {
        if (data.branch !== here.branch || !(Number(data.seq) > Number(here.seq))) return;
        newer = true;
      } else if (!type.startsWith("approval.") && type !== "thread.compacted") {
        return;
      }
      schedule();
    },
    onReconnect: schedule, // in case the events missed meanwhile were pruned before the replay
  });
}
