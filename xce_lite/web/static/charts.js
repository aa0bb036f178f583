// Draws the dashboard's charts with uPlot from JSON the page carries in
// <script type="application/json"> tags, and again after each live update (live.js).
"use strict";
(function () {
  const drawn = new Map();

  function data(id) {
    const tag = document.getElementById(id);
    return tag ? JSON.parse(tag.textContent) : null;
  }

  function axes(unit) {
    return [{}, {label: unit, size: 60}];
  }

  const builders = {
    utilisation(usage) {
      const xs = usage.points.map(p => p[0]);
      const total = usage.slots_total || 1;
      const pct = usage.points.map(p => Math.round(1000 * p[1] / total) / 10);
      return [{series: [{}, {label: "busy slots %", stroke: "#1f77b4", fill: "rgba(31,119,180,0.15)", width: 2}],
               scales: {y: {range: [0, 100]}}, axes: axes("%")}, [xs, pct]];
    },
    queue(usage) {
      const xs = usage.points.map(p => p[0]);
      return [{series: [{}, {label: "waiting", stroke: "#d62728", width: 2},
                        {label: "running", stroke: "#2ca02c", width: 2}], axes: axes("jobs")},
              [xs, usage.points.map(p => p[3]), usage.points.map(p => p[2])]];
    },
    accounting(chart) {
      const colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];
      const xs = chart.days.map(d => new Date(d + "T12:00:00").getTime() / 1000);
      const users = Object.keys(chart.series);
      const series = [{}].concat(users.map((u, i) => ({label: u, stroke: colors[i % colors.length], width: 2,
                                                         points: {show: true, size: 7}})));
      return [{series: series, axes: axes("slot-hours")}, [xs].concat(users.map(u => chart.series[u]))];
    },
  };

  function draw() {
    for (const [el, plot] of drawn) {
      if (!document.body.contains(el)) { plot.destroy(); drawn.delete(el); }
    }
    if (typeof uPlot === "undefined") return;
    document.querySelectorAll("[data-chart]").forEach(el => {
      if (drawn.has(el)) return;
      const source = data(el.dataset.source);
      const build = builders[el.dataset.chart];
      if (!source || !build) return;
      const [opts, values] = build(source);
      const width = Math.max(300, el.clientWidth || 600);
      const plot = new uPlot(Object.assign({width: width, height: 220, legend: {live: false}}, opts), values, el);
      el.dataset.drawn = "1";
      drawn.set(el, plot);
    });
  }

  document.addEventListener("DOMContentLoaded", draw);
  document.addEventListener("xce:updated", draw);
})();
