// The page: two views (chat, server) chosen by the address's #fragment, and the dialog
// that asks for the API key when the server answers 401.

import { whenKeyNeeded } from './api.js';
import * as chat from './chat.js';
import * as server from './server.js';

const $ = (id) => document.getElementById(id);

function route() {
  const view = location.hash === '#server' ? 'server' : 'chat';
  $('chat-view').hidden = view !== 'chat';
  $('server-view').hidden = view !== 'server';
  for (const a of document.querySelectorAll('nav a')) a.classList.toggle('on', a.dataset.view === view);
  document.body.dataset.view = view;
  server.watch(view === 'server');
}

let asking = null;  // one dialog however many requests were refused at once
whenKeyNeeded((why) => asking ||= new Promise((resolve) => {
  const dialog = $('key-dialog');
  $('key-why').textContent = why;
  $('key').value = '';
  $('key-cancel').onclick = () => dialog.close('cancel');
  dialog.onclose = () => { asking = null; resolve(dialog.returnValue === 'ok' && $('key').value || null); };
  dialog.showModal();
}));

window.addEventListener('hashchange', route);
chat.init();
route();
