// trainctl dashboard: the jobs on this machine, one run's curves, workers, failure, logs and
// evaluation, refreshed every 2 s without reloading. Text from the runs (names, log lines) only
// ever goes through textContent, never HTML.
'use strict';

const token = new URLSearchParams(location.search).get('token') || '';
const SVG = 'http://www.w3.org/2000/svg';
let selected = decodeURIComponent(location.hash.slice(1));
let shownEval = '';
let logRank = -1;  // -1: not chosen yet for this run

function api(path) {
  return fetch(path + (path.includes('?') ? '&' : '?') + 'token=' + encodeURIComponent(token))
    .then((r) => (r.ok ? r.json() : Promise.reject(new Error(path + ': HTTP ' + r.status))));
}

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function fillTable(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function svgEl(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  return e;
}

// A line chart of ys against xs in an SVG of 420 x 220 user units; `empty` says why there are none.
function lineChart(svg, xs, ys, empty) {
  const parts = [];
  const L = 46, R = 410, T = 10, B = 195;
  parts.push(svgEl('line', { class: 'axis', x1: L, y1: B, x2: R, y2: B }));
  parts.push(svgEl('line', { class: 'axis', x1: L, y1: T, x2: L, y2: B }));
  const label = (x, y, text, anchor, cls) => {
    const t = svgEl('text', { x, y, 'text-anchor': anchor });
    if (cls) t.setAttribute('class', cls);
    t.textContent = text;
    return t;
  };
  if (xs.length === 0) {
    parts.push(label((L + R) / 2, (T + B) / 2, empty, 'middle', 'empty'));
  } else {
    const x0 = Math.min(...xs), x1 = Math.max(...xs);
    let y0 = Math.min(...ys), y1 = Math.max(...ys);
    if (y1 === y0) {  // one value: a band around it, not a range from below zero
      const pad = Math.abs(y0) * 0.05 || 0.05;
      y1 += pad;
      y0 -= pad;
    }
    const sx = (x) => L + (x1 === x0 ? 0.5 : (x - x0) / (x1 - x0)) * (R - L);
    const sy = (y) => B - ((y - y0) / (y1 - y0)) * (B - T);
    const d = xs.map((x, i) => (i ? 'L' : 'M') + sx(x).toFixed(1) + ' ' + sy(ys[i]).toFixed(1)).join(' ');
    parts.push(svgEl('path', { class: 'curve', d }));
    if (xs.length <= 30) {  // points a reader can see, a single one included
      xs.forEach((x, i) => parts.push(svgEl('circle', { class: 'point', cx: sx(x).toFixed(1), cy: sy(ys[i]).toFixed(1), r: 3 })));
    }
    parts.push(label(L - 4, T + 8, y1.toPrecision(3), 'end'));
    parts.push(label(L - 4, B, y0.toPrecision(3), 'end'));
    parts.push(label(L, B + 14, 'step ' + x0, 'start'));
    parts.push(label(R, B + 14, 'step ' + x1, 'end'));
  }
  svg.replaceChildren(...parts);
}

function renderJobs(runs) {
  document.getElementById('no-jobs').hidden = runs.length > 0;
  document.getElementById('jobs-hint').hidden = runs.length === 0;
  fillTable(document.querySelector('#jobs tbody'), runs.map((r) => {
    const tr = el('tr');
    tr.dataset.run = r.run_id;
    if (r.run_id === selected) tr.className = 'selected';
    for (const [value, cls] of [[r.name], [r.run_id], [r.state, 'state-' + r.state], [r.tasks], [r.progress],
                                [r.elapsed], [r.output_dir]]) {
      tr.append(el('td', value, cls));
    }
    // The run id is a link too: the row opens the run, and so do a keyboard and a middle click.
    const link = el('a', r.run_id);
    link.href = '#' + encodeURIComponent(r.run_id);
    tr.children[1].replaceChildren(link);
    tr.addEventListener('click', () => { location.hash = encodeURIComponent(r.run_id); });
    return tr;
  }));
}

function renderEval(ev) {
  const status = document.getElementById('eval-status');
  if (ev.error) {
    status.textContent = ev.error;
    document.getElementById('eval').hidden = true;
    return;
  }
  status.textContent = 'Accuracy of the model on ' + ev.images + ' test images: ' + (100 * ev.accuracy).toFixed(1) + ' %';
  document.getElementById('eval').hidden = false;
  fillTable(document.querySelector('#classes tbody'), ev.classes.map((c) => {
    const tr = el('tr');
    tr.append(el('td', c.name), el('td', c.images), el('td', (100 * c.accuracy).toFixed(1) + ' %'));
    const bar = el('span', undefined, 'bar');
    bar.style.width = (8 * c.accuracy).toFixed(2) + 'em';
    const td = el('td');
    td.append(bar);
    tr.append(td);
    return tr;
  }));
  const cm = ev.confusion_matrix;
  const rows = [];
  const head = el('tr');
  head.append(el('th', ''));
  ev.classes.forEach((c, j) => head.append(el('th', j, undefined)));
  rows.push(head);
  cm.forEach((row, i) => {
    const tr = el('tr');
    tr.append(el('th', ev.classes[i].name));
    const total = row.reduce((a, b) => a + b, 0) || 1;
    row.forEach((n) => {
      const td = el('td', n, 'cm-cell');
      const share = n / total;
      td.style.background = 'rgba(9, 105, 218, ' + share.toFixed(3) + ')';
      if (share > 0.5) td.style.color = '#fff';
      tr.append(td);
    });
    rows.push(tr);
  });
  document.getElementById('confusion').replaceChildren(...rows);
  const boxes = (ev.misclassified || []).map((m) => {
    const box = el('div', undefined, 'mis');
    const canvas = el('canvas');
    canvas.width = m.cols;
    canvas.height = m.rows;
    const ctx = canvas.getContext('2d');
    const img = ctx.createImageData(m.cols, m.rows);
    m.pixels.forEach((v, k) => { img.data.set([v, v, v, 255], 4 * k); });
    ctx.putImageData(img, 0, 0);
    box.append(canvas, el('div', '#' + m.index + ': ' + ev.classes[m.label].name),
               el('div', 'predicted ' + m.predicted_name + ' (' + (100 * m.probability).toFixed(0) + ' %)'));
    return box;
  });
  document.getElementById('misclassified').replaceChildren(...boxes);
}

function renderRun(run) {
  document.getElementById('run').hidden = false;
  document.getElementById('run-title').textContent = run.name + ' \u2014 ' + run.run_id + ' (' + run.state + ')';
  document.getElementById('run-split').textContent = run.split || '';
  document.getElementById('run-timeline').hidden = !run.timeline;
  document.getElementById('timeline-link').href =
    '/api/runs/' + encodeURIComponent(run.run_id) + '/timeline?token=' + encodeURIComponent(token);
  const tr = run.series.train, te = run.series.test;
  const none = run.trainer === false
    ? 'none: this job runs its own program (the built-in trainer records these)'
    : run.alive ? 'none yet' : 'none recorded';
  lineChart(document.getElementById('chart-loss'), tr.step, tr.loss, none);
  lineChart(document.getElementById('chart-throughput'), tr.step, tr.samples_per_s, none);
  lineChart(document.getElementById('chart-accuracy'), te.step, te.accuracy,
            run.trainer === false || !run.alive ? none : 'none yet: measured at the end of each epoch');
  document.getElementById('no-workers').hidden = run.workers.length > 0;
  fillTable(document.querySelector('#workers tbody'), run.workers.map((w) => {
    const row = el('tr');
    row.append(el('td', w.rank), el('td', w.task), el('td', w.pid), el('td', w.cpu_percent.toFixed(1)),
               el('td', w.rss_mib.toFixed(1)), el('td', w.threads));
    return row;
  }));
  const failure = run.status && run.status.failure;
  document.getElementById('failure').hidden = !failure;
  if (failure) {
    document.getElementById('failure-text').textContent =
      failure.role + ' ' + failure.task_index + ' (rank ' + failure.rank + ' on ' + failure.host + '): ' + failure.exit +
      (failure.last_lines && failure.last_lines.length ? '\n' + failure.last_lines.join('\n') : '');
  }
  const select = document.getElementById('log-rank');
  const names = run.task_names || [];
  if (select.options.length !== run.ranks) {
    select.replaceChildren(...Array.from({ length: run.ranks }, (_, i) =>
      el('option', 'rank ' + i + (names[i] ? ' (' + names[i] + ')' : ''))));
    if (logRank < 0) {  // a new run: its first chief's or worker's log, not a parameter server's
      const first = names.findIndex((n) => /^(chief|worker)-/.test(n));
      logRank = first >= 0 ? first : 0;
    }
    select.selectedIndex = Math.min(logRank, run.ranks - 1);
  }
  api('/api/runs/' + encodeURIComponent(run.run_id) + '/logs?rank=' + Math.max(logRank, 0)).then((l) => {
    const pre = document.getElementById('log');
    const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.textContent = l.text;
    if (atEnd) pre.scrollTop = pre.scrollHeight;
  });
  if (shownEval !== run.run_id + run.state && !run.alive) {
    shownEval = run.run_id + run.state;
    document.getElementById('eval-status').textContent = 'Evaluating the model on the test set\u2026';
    api('/api/runs/' + encodeURIComponent(run.run_id) + '/eval').then(renderEval)
      .catch((e) => { document.getElementById('eval-status').textContent = String(e); });
  } else if (run.alive) {
    document.getElementById('eval-status').textContent = 'The model is evaluated once the run ends.';
    document.getElementById('eval').hidden = true;
  }
}

function refresh() {
  api('/api/runs').then((runs) => {
    renderJobs(runs);
    if (!selected && runs.length) selected = runs[0].run_id;
    document.getElementById('updated').textContent = 'updated ' + new Date().toLocaleTimeString();
    if (selected) return api('/api/runs/' + encodeURIComponent(selected)).then(renderRun);
  }).catch((e) => { document.getElementById('updated').textContent = String(e); });
}

window.addEventListener('hashchange', () => {
  selected = decodeURIComponent(location.hash.slice(1));
  logRank = -1;
  document.getElementById('log-rank').replaceChildren();
  refresh();
});
document.getElementById('log-rank').addEventListener('change', (e) => {
  logRank = e.target.selectedIndex;
  refresh();
});
refresh();
setInterval(refresh, 2000);
