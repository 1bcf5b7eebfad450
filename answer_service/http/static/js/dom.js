// DOM builders: `h` makes HTML elements, `s` makes SVG elements. Attributes whose value is
// null, undefined or false are left off, so callers can pass optional ones without branching.

const SVG_NS = 'http://www.w3.org/2000/svg';

function fill(node, attrs, children) {
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name === 'text') node.textContent = String(value);
    else if (name === 'dataset') Object.assign(node.dataset, value);
    else if (name.startsWith('on') && typeof value === 'function') {
      node.addEventListener(name.slice(2), value);
    } else node.setAttribute(name, value === true ? '' : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

export function h(tag, attrs = {}, ...children) {
  return fill(document.createElement(tag), attrs, children);
}

export function s(tag, attrs = {}, ...children) {
  return fill(document.createElementNS(SVG_NS, tag), attrs, children);
}

// An <svg> sized to its container's current width; charts are redrawn on every snapshot,
// so a window resize is picked up within a second without a ResizeObserver.
export function chartSvg(container, height_px) {
  const width_px = Math.max(240, Math.floor(container.clientWidth || 600));
  const svg = s('svg', {
    viewBox: `0 0 ${width_px} ${height_px}`,
    width: '100%',
    height: height_px,
    role: 'img',
  });
  return { svg, width_px, height_px };
}

export function emptyNote(text) {
  return h('p', { class: 'empty' }, text);
}
