// The sign-off queue, fetched again every few seconds (the server renders it: admin/sign_offs_live.html). A request
// already shown keeps its node, so a reason being typed survives the refresh; new ones appear, decided ones go.
(function () {
  async function refresh(root) {
    if (document.hidden) return;  // a tab nobody looks at asks for nothing
    try {
      const answer = await fetch(root.dataset.refreshUrl, { credentials: "same-origin" });
      if (answer.redirected) return location.reload();  // signed out: the page says so
      if (!answer.ok) return;  // the list shown stays until the next try
      const fresh = document.createElement("div");
      fresh.innerHTML = await answer.text();
      const list = document.getElementById("sign-off-list");
      const shown = new Map([...list.querySelectorAll("[data-sign-off]")].map((node) => [node.dataset.signOff, node]));
      const items = [...fresh.querySelector("#sign-off-list").children];
      list.replaceChildren(...items.map((node) => shown.get(node.dataset.signOff) || node));
      document.getElementById("sign-offs-updated").replaceWith(fresh.querySelector("#sign-offs-updated"));
    } catch (unreachable) {
      console.warn("sign-off queue refresh failed", unreachable);
    }
  }

  const root = document.getElementById("sign-offs");
  setInterval(() => refresh(root), Number(root.dataset.refreshSeconds) * 1000);
})();
