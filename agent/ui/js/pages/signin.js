// Sign-in: a bearer token, checked with `GET /v1/acl/whoami` before it is kept.

import { request, session } from '../api.js';
import { fill, h, refusal } from '../dom.js';

export function mount(root, { refused }) {
  const input = h('input', {
    id: 'token',
    name: 'token',
    type: 'password',
    autocomplete: 'off',
    spellcheck: 'false',
    placeholder: 'wmt.<name>.<secret>',
  });
  const result = h('div', { class: 'result' });
  if (refused) result.append(h('p', {}, 'The API refused the session:'), refusal(refused));
  const button = h('button', { type: 'submit' }, 'Sign in');
  // method=post and the policy's form-action 'none': were this script not running, the
  // browser would still never send the token anywhere, least of all in a URL.
  const form = h('form', { class: 'signin', method: 'post', onsubmit: submit },
    h('label', { for: 'token' }, 'Token'),
    input,
    button);
  root.append(
    h('div', { class: 'card narrow' },
      h('h1', {}, 'Sign in'),
      h('p', {}, 'With a token ', h('code', {}, 'waymark acl token-create'), ' minted (it needs the ',
        h('code', {}, 'read'), ' grant; overrides and evacuations need theirs), or, on ', h('code', {}, 'waymark dev'),
        ', the one in ', h('code', {}, '.waymark-dev/operator.token'), '.'),
      form,
      h('p', { class: 'hint' }, 'The token stays in this tab (sessionStorage) and is sent only in the Authorization header.'),
      result));
  input.focus();

  async function submit(event) {
    event.preventDefault();
    const token = input.value.trim();
    button.disabled = true;
    fill(result, h('p', {}, 'Checking the token…'));
    try {
      const { body } = await request('/v1/acl/whoami', { token });
      session.signIn(token, body.principal);
      input.value = '';
      location.hash = '#/services';
    } catch (err) {
      fill(result, h('p', {}, 'The API refused this token:'), refusal(err));
    } finally {
      button.disabled = false;
    }
  }
}
