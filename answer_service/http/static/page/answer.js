// The answer as it streams: tokens appended as text, and after each finished sentence the
// markers of the sources that support it (the `citation` event comes right after the
// sentence's last token, so its markers go at the current end). Hovering a marker shows the
// source; clicking it pins the popover and loads the whole passage (`GET /v1/passages/{id}`).

import { h } from '../js/dom.js';

export class AnswerView {
  constructor(root, popover, loadPassage) {
    this.root = root;
    this.popover = popover;
    this.loadPassage = loadPassage; // (passageId) => Promise<{title, text}>
    this.sources = new Map(); // number -> source payload
    this.pinned = null;
    document.addEventListener('click', (event) => {
      if (this.pinned && !this.popover.contains(event.target) && event.target !== this.pinned) {
        this.hide(true);
      }
    });
    document.addEventListener('keydown', (event) => {
      if (event.key === 'Escape') this.hide(true);
    });
  }

  reset() {
    this.root.replaceChildren();
    this.sources.clear();
    this.hide(true);
    delete this.root.dataset.form;
  }

  setSources(sources) {
    for (const source of sources) this.sources.set(source.number, source);
  }

  token(text) {
    const last = this.root.lastChild;
    if (last && last.nodeType === Node.TEXT_NODE) last.appendData(text);
    else this.root.append(text);
  }

  text() {
    return this.root.textContent;
  }

  citation(citation) {
    if (!citation.supported || citation.sources.length === 0) {
      this.root.append(h('span', { class: 'unsupported', title: 'no source supports this sentence' }, '*'));
      return;
    }
    for (const number of citation.sources) this.root.append(this.marker(number));
  }

  marker(number) {
    const button = h('button', { type: 'button', class: 'cite', dataset: { source: number } }, `[${number}]`);
    button.setAttribute('aria-label', `source ${number}`);
    button.addEventListener('mouseenter', () => this.pinned || this.show(button, number));
    button.addEventListener('focus', () => this.pinned || this.show(button, number));
    button.addEventListener('mouseleave', () => this.pinned || this.hide(false));
    button.addEventListener('click', (event) => {
      event.stopPropagation();
      this.show(button, number);
      this.pinned = button;
      this.popover.dataset.pinned = 'true';
      this.loadWhole(number);
    });
    return button;
  }

  show(anchor, number) {
    const source = this.sources.get(number);
    if (!source) return;
    // replaceChildren writes a null as the text "null": the link is left out instead.
    const link = source.url ? [h('a', { href: source.url, target: '_blank', rel: 'noopener' }, source.url)] : [];
    this.popover.replaceChildren(
      h('p', { class: 'pop-title' }, `[${number}] ${source.title || source.doc_id}`),
      h('p', { class: 'pop-text' }, source.snippet),
      ...link,
      h('small', { class: 'pop-id' }, source.id),
    );
    this.popover.dataset.source = number;
    this.popover.hidden = false;
    const box = anchor.getBoundingClientRect();
    const left = Math.min(window.scrollX + box.left, window.scrollX + window.innerWidth - 440);
    this.popover.style.left = `${Math.max(8, left)}px`;
    this.popover.style.top = `${window.scrollY + box.bottom + 6}px`;
  }

  async loadWhole(number) {
    const source = this.sources.get(number);
    if (!source) return;
    const text = this.popover.querySelector('.pop-text');
    try {
      const passage = await this.loadPassage(source.id);
      if (this.popover.dataset.source !== String(number)) return; // another marker since
      text.textContent = passage.text;
      text.classList.add('whole');
    } catch (error) {
      text.after(h('p', { class: 'pop-error' }, `The whole passage could not be loaded: ${error.message}`));
    }
  }

  hide(unpin) {
    if (unpin) {
      this.pinned = null;
      delete this.popover.dataset.pinned;
    }
    this.popover.hidden = true;
  }
}
