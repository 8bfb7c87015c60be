// mailsplit dashboard: swap in the server-rendered live part every 2 s,
// and ask before a Cancel. Everything else is plain HTML.
"use strict";
const live = document.getElementById("live");
setInterval(async () => {
  try {
    const r = await fetch("/live", { cache: "no-store", credentials: "same-origin" });
    if (r.status === 401) location.reload(); // session over: show the login form
    else if (r.ok) live.innerHTML = await r.text();
  } catch (_) { /* serve restarting: try again at the next tick */ }
}, 2000);
document.addEventListener("submit", (e) => {
  const question = e.target.dataset.confirm;
  if (question && !confirm(question)) e.preventDefault();
});
