// The inbox, live: new requests appear, votes and escalations show, and decided ones disappear without a reload.
import { connectFeed, fetchThisPage } from "./live.js";

const table = document.getElementById("inbox-body");
const pendingOnly = document.body.dataset.inboxStatus === "pending";

// The server renders the list under the page's own filters; fetch the same page and swap the
// part that changes. The feed tells of every approval this person may see, filtered or not, so
// an empty page reloads only when the fresh page has something to show (else, filtered to an
// agent with nothing pending, it would reload on every sync for ever).
let refreshing = null;

function refresh() {
  refreshing ??= fetchList().finally(() => {
    refreshing = null;
  });
  return refreshing;
}

async function fetchList() {
  const page = await fetchThisPage();
  if (!page) return;
  const fresh = page.getElementById("inbox-body");
  if (!table) {
    if (fresh) location.reload(); // the empty state has no list to update
    return;
  }
  if (fresh) table.replaceChildren(...fresh.childNodes);
}

function removeRow(approvalId) {
  document.querySelector(`tr[data-approval="${approvalId}"]`)?.remove();
}

if (pendingOnly) {
  connectFeed({
    path: "/ws/inbox/",
    ordered: false,
    onEvent(event) {
      if (event.type === "approval.decided") removeRow(event.data.approval);
      // A vote short of the quorum, or an escalation, changes the row: fetch the page again.
      if (["approval.requested", "approval.voted", "approval.escalated"].includes(event.type)) refresh();
    },
    onSync(event) {
      const pending = new Set(event.data.pending);
      const shown = [...document.querySelectorAll("tr[data-approval]")].map((row) => row.dataset.approval);
      shown.filter((id) => !pending.has(id)).forEach(removeRow);
      if ([...pending].some((id) => !shown.includes(id))) refresh();
    },
  });
}
