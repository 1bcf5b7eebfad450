// The prefix cache's share of prompt tokens per SGLang worker: one bar per worker on a 0-100%
// track, with the token counts behind the share.

import { chartSvg, emptyNote, s } from './dom.js';
import { compact, isNum, list, num, pct } from './format.js';
import { linear } from './scale.js';

const ROW_H = 36;

function shareOf(row) {
  if (isNum(row.share)) return row.share;
  const prompt = num(row.prompt_tokens);
  return prompt > 0 ? num(row.cached_tokens) / prompt : null;
}

function workerName(worker) {
  return String(worker ?? 'unknown').replace(/^https?:\/\//, '');
}

export function createCacheShare(root) {
  return {
    render(snapshot) {
      const rows = list(snapshot.cache_share).filter((r) => r && typeof r === 'object');
      if (!rows.length) {
        root.replaceChildren(emptyNote('No prompts sent to a worker yet.'));
        return;
      }
      const { svg, width_px } = chartSvg(root, rows.length * ROW_H + 4);
      const x = linear([0, 1], [0, width_px]);
      rows.forEach((row, i) => {
        const top = i * ROW_H + 2;
        const share = shareOf(row);
        const title = `${workerName(row.worker)}: ${pct(share)} of ${compact(row.prompt_tokens)} prompt tokens cached`;
        svg.append(
          s('text', { class: 'group-label', x: 0, y: top + 11 }, workerName(row.worker)),
          s('text', { class: 'bar-value', x: width_px, y: top + 11, 'text-anchor': 'end' },
            `${pct(share)} · ${compact(row.cached_tokens)} / ${compact(row.prompt_tokens)} tokens`),
          s('rect', { class: 'track', x: 0, y: top + 16, width: width_px, height: 12, rx: 2 }),
        );
        if (isNum(share)) {
          const clamped = Math.min(1, Math.max(0, share));
          svg.append(s('rect', {
            class: 'bar bar-share', x: 0, y: top + 16, width: Math.max(1, x(clamped)), height: 12, rx: 2,
          }, s('title', {}, title)));
        }
      });
      root.replaceChildren(svg);
    },
  };
}
