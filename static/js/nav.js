// The Inbox count in the nav, live on every page: the requests waiting for a person that this person
// may see. The inbox feed sends them all on connect (and on every reconnect), then each request
// and decision as it commits.
import { connectFeed } from "./live.js";

const link = document.getElementById("nav-inbox");

function show(pending) {
  let badge = link.querySelector(".nav-count");
  if (!pending.size) {
    badge?.remove();
    return;
  }
  if (!badge) {
    badge = document.createElement("span");
    badge.className = "nav-count";
    link.append(" ", badge);
  }
  badge.textContent = String(pending.size);
  badge.setAttribute("aria-label", `${pending.size} pending`);
}

if (link) {
  const pending = new Set();
  connectFeed({
    path: "/ws/inbox/",
    ordered: false,
    status: false,
    onSync(event) {
      pending.clear();
      event.data.pending.forEach((id) => pending.add(id));
      show(pending);
    },
    onEvent(event) {
      const id = event.data?.approval;
      if (!id) return;
      if (event.type === "approval.requested" && event.data.status === "pending") pending.add(id);
      else if (event.type === "approval.decided") pending.delete(id);
      else return;
      show(pending);
    },
  });
}
