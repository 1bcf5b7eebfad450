// The search page: one question at a time, answered by `POST /v1/answer` as it streams.
//
// The question box starts a conversation; the follow-up box continues it: each follow-up is
// sent with the turns before it (`history`: each question and the answer it got, the latest
// ones), so "and how do I stop one?" is searched with what came before (the service's rewrite;
// the plan's `searched_query`, shown under the answer when it differs from the question).
//
// document.body.dataset.state is the page's state (idle, asking, streaming, done, abstained,
// stopped, refused, failed), for people's eyes (styles) and the browser tests.

import { AnswerView } from './answer.js';
import { renderSources } from './sources.js';
import { answerEvents, fetchPassage, HttpError } from './stream.js';
import { authHeaders, storedKey, storeKey } from './key.js';
import { renderTimings } from './timings.js';

const $ = (id) => document.getElementById(id);

const ui = {
  ask: $('ask'), question: $('question'), askButton: $('ask-button'), stop: $('stop'),
  mode: $('mode'), budget: $('budget'), status: $('status'), result: $('result'),
  sources: $('sources'), timings: $('timings'), abstainNote: $('abstain-note'),
  followUp: $('follow-up'), followUpQuestion: $('follow-up-question'),
  keyForm: $('key-form'), key: $('key'), keyWhy: $('key-why'), keyChange: $('key-change'),
  keyForget: $('key-forget'), searched: $('searched'),
};

let apiKey = storedKey();
let running = null; // the AbortController of the request in flight
let lastQuestion = '';
let lastHistory = []; // the history the last question was sent with (asked again after a key)
let conversation = []; // {role, content} turns, oldest first
// What a conversation sends at most: the service takes 50 turns and 32 KiB.
const KEPT_TURNS = 20;
const TURN_CHARS = 1500;
const view = new AnswerView($('answer'), $('popover'), (id) => fetchPassage(id, authHeaders(apiKey)));

function setState(state, message = '') {
  document.body.dataset.state = state;
  ui.status.dataset.state = state;
  ui.status.textContent = message;
  const busy = state === 'asking' || state === 'streaming';
  ui.stop.hidden = !busy;
  ui.askButton.disabled = busy;
  ui.followUp.hidden = busy || !lastQuestion || state === 'refused';
}

function showKeyForm(reason) {
  ui.keyWhy.textContent = reason;
  ui.keyForm.hidden = false;
  ui.key.value = '';
  ui.key.focus();
}

function requestBody(query, history) {
  const body = { query };
  if (history.length) body.history = history;
  if (ui.mode.value) body.answer_mode = ui.mode.value;
  const budget = Number.parseInt(ui.budget.value, 10);
  if (Number.isFinite(budget) && budget > 0) body.ttft_budget_ms = budget;
  return body;
}

function refused(error) {
  if (error.status === 401) {
    showKeyForm(apiKey ? `The service did not take this key: ${error.message}` : 'This service needs an API key.');
    setState('refused', 'An API key is needed: enter it below, and the question is asked again.');
    return;
  }
  const wait = error.retryAfterS === null ? '' : ` Try again in ${error.retryAfterS} s.`;
  if (error.status === 429) {
    setState('refused', `Too many requests for this key right now (${error.message}).${wait}`);
  } else if (error.status === 503) {
    setState('refused', `The service cannot answer now: ${error.message}.${wait}`);
  } else {
    setState('failed', `The request failed (${error.status} ${error.code}): ${error.message}`);
  }
  ui.status.dataset.status = String(error.status);
}

async function ask(query, history = []) {
  if (running) running.abort();
  const controller = new AbortController();
  running = controller;
  lastQuestion = query;
  lastHistory = history;
  ui.searched.hidden = true;
  view.reset();
  ui.result.hidden = true;
  ui.abstainNote.hidden = true;
  ui.sources.replaceChildren();
  ui.timings.replaceChildren();
  delete ui.status.dataset.status;
  setState('asking', 'Asking…');
  let plan = null;
  let done = null;
  let failure = null;
  try {
    for await (const { event, data } of answerEvents(requestBody(query, history), authHeaders(apiKey), controller.signal)) {
      ui.result.hidden = false;
      if (event === 'plan') {
        plan = data;
        showSearched(query, data.searched_query);
        renderTimings(ui.timings, plan, null);
      } else if (event === 'sources') {
        view.setSources(data.sources);
        renderSources(ui.sources, data.sources);
      } else if (event === 'token') {
        if (document.body.dataset.state !== 'streaming') setState('streaming', 'Answering…');
        view.token(data.text);
      } else if (event === 'citation') {
        view.citation(data);
      } else if (event === 'error') {
        failure = data;
      } else if (event === 'done') {
        done = data;
        renderTimings(ui.timings, plan, done);
      }
    }
  } catch (error) {
    if (controller.signal.aborted) {
      if (running === controller) setState('stopped', 'Stopped: the service was told to stop.');
      return;
    }
    if (error instanceof HttpError) refused(error);
    else setState('failed', `The connection failed: ${error.message}`);
    return;
  } finally {
    if (running === controller) running = null;
  }
  finish(done, failure);
  if (done && !failure) {
    const answer = view.text().slice(0, TURN_CHARS);
    conversation = [...history, { role: 'user', content: query }, { role: 'assistant', content: answer }];
    conversation = conversation.slice(-KEPT_TURNS);
  }
}

function showSearched(query, searched) {
  ui.searched.hidden = !searched || searched === query;
  ui.searched.textContent = searched ? `Searched as: ${searched}` : '';
}

function finish(done, failure) {
  if (failure) {
    setState('failed', `The ${failure.stage} stage failed (${failure.code}): ${failure.message}`);
  } else if (done && done.form === 'abstain') {
    $('answer').dataset.form = 'abstain';
    ui.abstainNote.hidden = false;
    setState('abstained', 'I do not know: the sources do not answer this.');
  } else if (done) {
    $('answer').dataset.form = done.form;
    const sourcesOnly = done.form === 'sources_only' ? ' No answer fitted the budget: only the sources.' : '';
    setState('done', `Answered in ${Math.round(done.ttft_ms ?? 0)} ms to the first token.${sourcesOnly}`);
  } else {
    setState('failed', 'The answer ended before the service said it was done.');
  }
}

ui.ask.addEventListener('submit', (event) => {
  event.preventDefault();
  const query = ui.question.value.trim();
  if (query) ask(query); // a new conversation
});

ui.followUp.addEventListener('submit', (event) => {
  event.preventDefault();
  const query = ui.followUpQuestion.value.trim();
  if (!query) return;
  ui.question.value = query;
  ui.followUpQuestion.value = '';
  ask(query, conversation);
});

ui.stop.addEventListener('click', () => {
  if (running) running.abort();
});

ui.keyForm.addEventListener('submit', (event) => {
  event.preventDefault();
  apiKey = ui.key.value.trim();
  storeKey(apiKey);
  ui.keyForm.hidden = true;
  ui.keyChange.hidden = false;
  if (lastQuestion) ask(lastQuestion, lastHistory);
});

ui.keyForget.addEventListener('click', () => {
  apiKey = '';
  storeKey('');
  ui.keyForm.hidden = true;
  ui.keyChange.hidden = true;
});

ui.keyChange.addEventListener('click', () => showKeyForm('Change or forget the API key.'));
ui.keyChange.hidden = !apiKey;
setState('idle');
ui.question.focus();
