// An instance's verdicts over time as inline SVG: a band coloured by verdict, and its
// weight as a step line below. Drawn from the audit log's transition records.

import { clock, duration, s } from './dom.js';

const WIDTH = 760;
const LEFT = 44;
const RIGHT = 12;
const BAND_TOP = 8;
const BAND = 22;
const PLOT_TOP = 44;
const PLOT = 90;
const HEIGHT = PLOT_TOP + PLOT + 28;

/**
 * `points`: `[{at_ms, verdict, weight}]`, oldest first, each the state from then on;
 * drawn up to `now_ms`. Returns an `<svg>`.
 */
export function timeline(points, nowMs) {
  const svg = s('svg', {
    class: 'timeline',
    viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
    role: 'img',
    'aria-label': 'verdict and weight over time',
  });
  if (!points.length) {
    svg.append(s('text', { x: LEFT, y: PLOT_TOP, class: 'axis' }, 'no transition recorded yet'));
    return svg;
  }
  const start = points[0].at_ms;
  const end = Math.max(nowMs, points[points.length - 1].at_ms + 1000);
  const x = (t) => LEFT + ((t - start) / (end - start)) * (WIDTH - LEFT - RIGHT);
  const top = Math.max(100, ...points.map((p) => p.weight ?? 0));
  const y = (w) => PLOT_TOP + PLOT - ((w ?? 0) / top) * PLOT;

  // The verdict band, one rectangle per stretch of one verdict.
  const stretches = [];
  for (const p of points) {
    const last = stretches[stretches.length - 1];
    if (last && last.verdict === p.verdict) continue;
    stretches.push(p);
  }
  stretches.forEach((p, i) => {
    const from = p.at_ms;
    const to = i + 1 < stretches.length ? stretches[i + 1].at_ms : end;
    svg.append(s('rect', {
      class: `band v-${p.verdict}`,
      x: x(from).toFixed(1),
      y: BAND_TOP,
      width: Math.max(1, x(to) - x(from)).toFixed(1),
      height: BAND,
      dataset: { verdict: p.verdict },
    }, s('title', {}, `${p.verdict} from ${clock(from)} for ${duration(to - from)}${p.rule ? ` (${p.rule})` : ''}`)));
  });

  // The weight, as a step line.
  let d = `M ${x(start).toFixed(1)} ${y(points[0].weight).toFixed(1)}`;
  points.forEach((p, i) => {
    const to = i + 1 < points.length ? points[i + 1].at_ms : end;
    d += ` V ${y(p.weight).toFixed(1)} H ${x(to).toFixed(1)}`;
  });
  svg.append(
    s('line', { class: 'grid', x1: LEFT, x2: WIDTH - RIGHT, y1: y(0), y2: y(0) }),
    s('line', { class: 'grid', x1: LEFT, x2: WIDTH - RIGHT, y1: y(top), y2: y(top) }),
    s('text', { class: 'axis', x: LEFT - 6, y: y(top) + 4, 'text-anchor': 'end' }, String(top)),
    s('text', { class: 'axis', x: LEFT - 6, y: y(0) + 4, 'text-anchor': 'end' }, '0'),
    s('text', { class: 'axis', x: 2, y: BAND_TOP + 15 }, 'verdict'),
    s('text', { class: 'axis', x: 2, y: PLOT_TOP + PLOT / 2 }, 'weight'),
    s('path', { class: 'weight', d }));

  // Time ticks.
  for (let k = 0; k <= 4; k++) {
    const t = start + ((end - start) * k) / 4;
    const anchor = k === 0 ? 'start' : k === 4 ? 'end' : 'middle';
    svg.append(
      s('line', { class: 'tick', x1: x(t), x2: x(t), y1: y(0), y2: y(0) + 4 }),
      s('text', { class: 'axis', x: x(t), y: HEIGHT - 8, 'text-anchor': anchor }, clock(t)));
  }
  return svg;
}
