// The dashboard's charts, drawn by Chart.js from the data the page carries (#dashboard-data).
(function () {
  const data = JSON.parse(document.getElementById("dashboard-data").textContent);
  const palette = ["#417690", "#d9822b", "#5b9a68", "#a64d79", "#7d6b3d", "#3d6b7d", "#b5443b", "#6b5bd9"];
  const upstreams = Object.keys(data.calls);
  const colour = (i) => palette[i % palette.length];
  const line = (series, i, extra) =>
    Object.assign({ label: upstreams[i], data: series[upstreams[i]], borderColor: colour(i),
      backgroundColor: colour(i), spanGaps: true, tension: 0.2, pointRadius: 2 }, extra || {});
  const options = { animation: false, responsive: true, maintainAspectRatio: false,
    scales: { y: { beginAtZero: true } }, plugins: { legend: { position: "bottom" } } };
  const draw = (id, type, datasets) =>
    new Chart(document.getElementById(id), { type: type, data: { labels: data.labels, datasets: datasets }, options: options });
  draw("chart-calls", "bar", upstreams.map((_, i) => line(data.calls, i)));
  draw("chart-errors", "line", upstreams.map((_, i) => line(data.error_rate, i)));
  draw("chart-latency", "line", upstreams.flatMap((_, i) => [
    line(data.p95, i, { label: upstreams[i] + " p95" }),
    line(data.p50, i, { label: upstreams[i] + " p50", borderDash: [4, 4] }),
  ]));
})();
