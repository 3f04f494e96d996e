// The decision page: edited arguments are checked as JSON before they are sent, a high-risk
// approval is confirmed with its arguments in view, the plain Approve waits while arguments are
// being edited, votes cast elsewhere show as they come, and a decision taken elsewhere replaces
// the forms as soon as it is made.
import { navigableTree } from "./json_tree.js";
import { connectFeed, fetchThisPage } from "./live.js";

navigableTree(document.getElementById("state-tree"));

const approvalId = document.body.dataset.approval;
const form = document.getElementById("edit-form");
const field = document.getElementById("edit-args");
const errors = document.getElementById("args-errors");

function check() {
  try {
    JSON.parse(field.value);
    field.removeAttribute("aria-invalid");
    errors.textContent = "";
    return true;
  } catch (error) {
    field.setAttribute("aria-invalid", "true");
    errors.innerHTML = "";
    const item = document.createElement("li");
    item.textContent = `This is not valid JSON: ${error.message}`;
    errors.append(item);
    return false;
  }
}

if (form && field && errors) {
  field.addEventListener("input", check);
  form.addEventListener("submit", (event) => {
    if (!check()) event.preventDefault();
  });
}

// Approving the arguments as proposed while an edit is open would drop the edit.
const approveButton = document.getElementById("approve");
const edit = document.getElementById("edit-approve");
const hint = document.getElementById("approve-hint");

const approveNext = document.getElementById("approve-next");

function followEdit() {
  approveButton.disabled = edit.open;
  if (approveNext) approveNext.disabled = edit.open;
  hint.hidden = !edit.open;
}

if (approveButton && edit && hint) {
  edit.addEventListener("toggle", followEdit);
  followEdit();
}

// A high-risk approval goes through only once confirmed in the dialog, which shows the arguments
// it will run with: the proposed ones, or the edited ones.
const approveForm = document.getElementById("approve-form");
const dialog = document.getElementById("confirm-approve");
const shownArgs = document.getElementById("confirm-approve-args");
const which = document.getElementById("confirm-approve-which");
const proposedArgs = shownArgs?.textContent ?? "";
let confirming = null; // the form the dialog is asking about

let submitter = null; // the button that asked: "Approve" or "Approve & next"

function confirmFirst(target, args, description) {
  target.addEventListener("submit", (event) => {
    if (target.dataset.confirmed || event.defaultPrevented) return;
    event.preventDefault();
    confirming = target;
    submitter = event.submitter ?? null;
    shownArgs.textContent = args();
    which.textContent = description;
    dialog.showModal();
  });
}

if (dialog && shownArgs && which) {
  if (approveForm && "confirm" in approveForm.dataset) {
    confirmFirst(approveForm, () => proposedArgs, "these arguments");
  }
  if (form && field && "confirm" in form.dataset) {
    confirmFirst(form, () => JSON.stringify(JSON.parse(field.value), null, 2), "these edited arguments");
  }
  dialog.addEventListener("close", () => {
    const target = confirming;
    confirming = null;
    if (dialog.returnValue !== "approve" || !target) return;
    target.dataset.confirmed = "yes";
    target.requestSubmit(submitter && target.contains(submitter) ? submitter : undefined);
  });
}

// Someone else decided: show their decision instead of forms that can only conflict now.
async function showDecision() {
  const decision = document.getElementById("decision");
  if (!decision || !("pending" in decision.dataset)) return; // decided already on this page
  const page = await fetchThisPage();
  if (!page) return;
  const fresh = page.getElementById("decision");
  if (fresh && !("pending" in fresh.dataset)) {
    if (dialog?.open) dialog.close("cancel");
    decision.replaceWith(fresh);
    // The inbox count in the nav has one fewer now.
    const badge = page.getElementById("nav-inbox");
    if (badge) document.getElementById("nav-inbox")?.replaceChildren(...badge.childNodes);
  }
}

// Another reviewer voted short of the quorum, or the request escalated: show who approved so far.
async function showVotes() {
  const page = await fetchThisPage();
  const fresh = page?.getElementById("policy");
  if (fresh) document.getElementById("policy")?.replaceWith(fresh);
}

if (approvalId && "pending" in (document.getElementById("decision")?.dataset ?? {})) {
  connectFeed({
    path: "/ws/inbox/",
    ordered: false,
    onEvent(event) {
      if (event.data.approval !== approvalId) return;
      if (event.type === "approval.decided") showDecision();
      if (event.type === "approval.voted" || event.type === "approval.escalated") showVotes();
    },
    onSync(event) {
      if (!event.data.pending.includes(approvalId)) showDecision();
    },
  });
}
