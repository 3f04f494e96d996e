// The inbox, live: new requests appear, votes and escalations show, and decided ones disappear
// without a reload. And its triage by keyboard: j/k move between requests, o or Enter opens one,
// a approves it, r rejects it with a comment, e edits it, x selects a low-risk one, ? lists these.
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
  select(selected);
}

function removeRow(approvalId) {
  document.querySelector(`tr[data-approval="${approvalId}"]`)?.remove();
  select(selected);
}

// The selected row survives a decision taken from it: the page comes back from the server with
// the request gone, and the same position then holds the next one.
const rows = () => [...document.querySelectorAll("#inbox-body tr[data-approval]")];
const remembered = `inbox-selected:${location.pathname}${location.search}`;
let selected = Number(sessionStorage.getItem(remembered) ?? 0) || 0;

function select(index) {
  const all = rows();
  if (!all.length) return;
  selected = Math.max(0, Math.min(index, all.length - 1));
  sessionStorage.setItem(remembered, String(selected));
  all.forEach((row, position) => {
    row.classList.toggle("selected", position === selected);
    if (position === selected) row.setAttribute("aria-selected", "true");
    else row.removeAttribute("aria-selected");
  });
  const row = all[selected];
  row.querySelector("a.open")?.focus({ preventScroll: true });
  row.scrollIntoView({ block: "nearest" });
}

const rejectDialog = document.getElementById("reject-dialog");
const rejectForm = document.getElementById("reject-row-form");

function openReject(row) {
  const link = row.querySelector("a.reject-row");
  if (!link || !rejectDialog) return;
  rejectForm.action = link.pathname;
  document.getElementById("reject-dialog-action").textContent = link.dataset.action;
  rejectDialog.showModal();
  document.getElementById("reject-row-comment").focus();
}

document.addEventListener("click", (event) => {
  const link = event.target.closest?.("a.reject-row");
  if (!link || !rejectDialog) return;
  event.preventDefault();
  select(rows().indexOf(link.closest("tr")));
  openReject(link.closest("tr"));
});
document.getElementById("reject-row-no")?.addEventListener("click", () => rejectDialog.close());

function approve(row) {
  const form = row.querySelector("form.approve-row");
  if (form) form.requestSubmit();
  else location.assign(row.querySelector("a.open").href); // high risk: confirmed on its page
}

const keys = {
  j: () => select(selected + 1),
  ArrowDown: () => select(selected + 1),
  k: () => select(selected - 1),
  ArrowUp: () => select(selected - 1),
  o: (row) => location.assign(row.querySelector("a.open").href),
  a: approve,
  r: openReject,
  e: (row) => location.assign(`${row.querySelector("a.open").pathname}?edit=1#edit-approve`),
  x: (row) => {
    const box = row.querySelector("input[type=checkbox]");
    if (box) box.checked = !box.checked;
  },
};

if (table && document.getElementById("shortcuts")) {
  select(selected);
  document.addEventListener("keydown", (event) => {
    if (event.defaultPrevented || event.ctrlKey || event.metaKey || event.altKey) return;
    if (event.target.closest?.("input, textarea, select, dialog") || rejectDialog?.open) return;
    if (event.key === "?") {
      const help = document.getElementById("shortcuts");
      help.hidden = !help.hidden;
      return;
    }
    const row = rows()[selected];
    const act = keys[event.key];
    if (!act || !row) return;
    event.preventDefault();
    act(row);
  });
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
