// The dashboard's charts, drawn by Chart.js from the data the page carries (#dashboard-data), and its figures
// fetched again every few seconds (the server renders them: admin/dashboard_live.html), charts redrawn.
(function () {
  const palette = ["#417690", "#d9822b", "#5b9a68", "#a64d79", "#7d6b3d", "#3d6b7d", "#b5443b", "#6b5bd9"];
  const options = { animation: false, responsive: true, maintainAspectRatio: false,
    scales: { y: { beginAtZero: true } }, plugins: { legend: { position: "bottom" } } };

  function draw() {
    const data = JSON.parse(document.getElementById("dashboard-data").textContent);
    const upstreams = Object.keys(data.calls);
    const colour = (i) => palette[i % palette.length];
    const line = (series, i, extra) =>
      Object.assign({ label: upstreams[i], data: series[upstreams[i]], borderColor: colour(i),
        backgroundColor: colour(i), spanGaps: true, tension: 0.2, pointRadius: 2 }, extra || {});
    const chart = (id, type, datasets) =>
      new Chart(document.getElementById(id), { type: type, data: { labels: data.labels, datasets: datasets }, options: options });
    chart("chart-calls", "bar", upstreams.map((_, i) => line(data.calls, i)));
    chart("chart-errors", "line", upstreams.map((_, i) => line(data.error_rate, i)));
    chart("chart-latency", "line", upstreams.flatMap((_, i) => [
      line(data.p95, i, { label: upstreams[i] + " p95" }),
      line(data.p50, i, { label: upstreams[i] + " p50", borderDash: [4, 4] }),
    ]));
  }

  async function refresh(root) {
    if (document.hidden) return;  // a tab nobody looks at asks for nothing
    try {
      const answer = await fetch(root.dataset.refreshUrl, { credentials: "same-origin" });
      if (answer.redirected) return location.reload();  // signed out: the page says so
      if (!answer.ok) return;  // the figures shown stay until the next try
      const live = document.getElementById("dashboard-live");
      ["chart-calls", "chart-errors", "chart-latency"].forEach((id) => Chart.getChart(id)?.destroy());
      live.innerHTML = await answer.text();
      draw();
    } catch (unreachable) {
      console.warn("dashboard refresh failed", unreachable);
    }
  }

  const root = document.getElementById("dashboard");
  draw();
  setInterval(() => refresh(root), Number(root.dataset.refreshSeconds) * 1000);
})();
