// hearth chat page: talks to this server's own API (/api/tags, /api/chat, /api/ps,
// /api/create, /api/blobs, /api/pull). No framework, no network beyond this origin.
// Model text is never put into the page as HTML: renderMarkdown() escapes it first and
// only adds the tags it builds itself; everything else goes through textContent.
'use strict'

const $ = (id) => document.getElementById(id)
const STORE = 'hearth.conversations'
const CURRENT = 'hearth.current'
const SETTINGS = 'hearth.settings'

// ---------------- markdown (escape first, then a small safe subset) ----------------

function escapeHtml(s) {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;')
    .replace(/"/g, '&quot;').replace(/'/g, '&#39;')
}

// Inline markup on already escaped text: `code`, **bold**, *italic* / _italic_, and
// [links](http...) whose scheme is http, https or mailto (anything else stays text).
function renderInline(esc) {
  const codes = []
  esc = esc.replace(/`([^`\n]+)`/g, (_, c) => { codes.push(c); return `\u0000${codes.length - 1}\u0000` })
  esc = esc.replace(/\[([^\]\n]+)\]\(([^)\s]+)\)/g, (m, text, url) =>
    /^(https?:|mailto:)/i.test(url)
      ? `<a href="${url}" target="_blank" rel="noopener noreferrer">${text}</a>` : m)
  esc = esc.replace(/\*\*([^*\n]+)\*\*/g, '<strong>$1</strong>')
  esc = esc.replace(/(^|[^*\w])\*([^*\s][^*\n]*?)\*(?!\w)/g, '$1<em>$2</em>')
  esc = esc.replace(/(^|[^\w])_([^_\s][^_\n]*?)_(?!\w)/g, '$1<em>$2</em>')
  return esc.replace(/\u0000(\d+)\u0000/g, (_, i) => `<code>${codes[+i]}</code>`)
}

function renderMarkdown(text) {
  const out = []
  const lines = escapeHtml(text).split('\n')
  let para = []
  let list = null // {tag, items}
  const flushPara = () => {
    if (para.length) out.push(`<p>${para.map(renderInline).join('<br>')}</p>`)
    para = []
  }
  const flushList = () => {
    if (list) out.push(`<${list.tag}>${list.items.map((i) => `<li>${renderInline(i)}</li>`).join('')}</${list.tag}>`)
    list = null
  }
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]
    const fence = line.match(/^\s*```\s*([\w+#.-]*)/)
    if (fence) { // a code block runs to the closing fence (or the end, while streaming)
      flushPara(); flushList()
      const body = []
      for (i++; i < lines.length && !/^\s*```\s*$/.test(lines[i]); i++) body.push(lines[i])
      const lang = fence[1] ? ` class="language-${fence[1]}"` : ''
      out.push(`<pre><code${lang}>${body.join('\n')}</code></pre>`)
      continue
    }
    const heading = line.match(/^(#{1,6})\s+(.*)$/)
    const ul = line.match(/^\s*[-*+]\s+(.*)$/)
    const ol = line.match(/^\s*\d+[.)]\s+(.*)$/)
    if (heading) {
      flushPara(); flushList()
      const n = Math.min(heading[1].length + 2, 6) // small headings inside a message
      out.push(`<h${n}>${renderInline(heading[2])}</h${n}>`)
    } else if (ul || ol) {
      flushPara()
      const tag = ul ? 'ul' : 'ol'
      if (list && list.tag !== tag) flushList()
      if (!list) list = { tag, items: [] }
      list.items.push((ul || ol)[1])
    } else if (!line.trim()) {
      flushPara(); flushList()
    } else {
      flushList()
      para.push(line)
    }
  }
  flushPara(); flushList()
  return out.join('')
}

// ---------------- SHA-256 (incremental: GGUF files are too big to hash in one piece) ----------------

class Sha256 {
  constructor() {
    this.h = new Uint32Array([0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
      0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19])
    this.buf = new Uint8Array(64)
    this.n = 0 // bytes in buf
    this.total = 0
    this.w = new Uint32Array(64)
  }
  block(b, off) {
    const K = Sha256.K, w = this.w, h = this.h
    for (let i = 0; i < 16; i++) w[i] = (b[off + 4 * i] << 24) | (b[off + 4 * i + 1] << 16) | (b[off + 4 * i + 2] << 8) | b[off + 4 * i + 3]
    for (let i = 16; i < 64; i++) {
      const x = w[i - 15], y = w[i - 2]
      const s0 = ((x >>> 7) | (x << 25)) ^ ((x >>> 18) | (x << 14)) ^ (x >>> 3)
      const s1 = ((y >>> 17) | (y << 15)) ^ ((y >>> 19) | (y << 13)) ^ (y >>> 10)
      w[i] = (w[i - 16] + s0 + w[i - 7] + s1) | 0
    }
    let [a, b2, c, d, e, f, g, hh] = h
    for (let i = 0; i < 64; i++) {
      const S1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7))
      const t1 = (hh + S1 + ((e & f) ^ (~e & g)) + K[i] + w[i]) | 0
      const S0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10))
      const t2 = (S0 + ((a & b2) ^ (a & c) ^ (b2 & c))) | 0
      hh = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b2; b2 = a; a = (t1 + t2) | 0
    }
    h[0] += a; h[1] += b2; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh
  }
  update(data) {
    let i = 0
    this.total += data.length
    if (this.n) {
      while (this.n < 64 && i < data.length) this.buf[this.n++] = data[i++]
      if (this.n < 64) return
      this.block(this.buf, 0)
      this.n = 0
    }
    for (; i + 64 <= data.length; i += 64) this.block(data, i)
    while (i < data.length) this.buf[this.n++] = data[i++]
  }
  hex() {
    const bits = this.total * 8
    const pad = new Uint8Array(((this.n < 56 ? 56 : 120) - this.n) + 8)
    pad[0] = 0x80
    const hi = Math.floor(bits / 0x100000000), lo = bits >>> 0
    const end = pad.length
    pad[end - 8] = hi >>> 24; pad[end - 7] = hi >>> 16; pad[end - 6] = hi >>> 8; pad[end - 5] = hi
    pad[end - 4] = lo >>> 24; pad[end - 3] = lo >>> 16; pad[end - 2] = lo >>> 8; pad[end - 1] = lo
    const total = this.total
    this.update(pad)
    this.total = total
    return Array.from(this.h, (x) => x.toString(16).padStart(8, '0')).join('')
  }
}
Sha256.K = new Uint32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2])

// ---------------- state (kept in localStorage) ----------------

function load(key, dflt) {
  try { const v = JSON.parse(localStorage.getItem(key)); return v ?? dflt } catch { return dflt }
}
function save(key, v) {
  // _el: a message's element on the page, not state
  try { localStorage.setItem(key, JSON.stringify(v, (k, x) => (k === '_el' ? undefined : x))) } catch (e) { console.warn('localStorage:', e) }
}

const state = {
  convs: load(STORE, []), // [{id, title, model, messages: [{role, content, thinking, model, stats, error}]}]
  current: load(CURRENT, null),
  settings: load(SETTINGS, { system: '', temperature: '', num_ctx: '', num_predict: '', think: false }),
  models: [],
  busy: null, // {controller, msg}
}

const conv = () => state.convs.find((c) => c.id === state.current)
const persist = () => { save(STORE, state.convs); save(CURRENT, state.current) }

function newConversation() {
  const c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: 'New conversation',
    model: $('model').value || '', messages: [] }
  state.convs.unshift(c)
  state.current = c.id
  persist()
  renderAll()
}

// ---------------- rendering ----------------

function fmtBytes(n) {
  if (!n) return '0 B'
  const u = ['B', 'KB', 'MB', 'GB', 'TB']
  const i = Math.min(Math.floor(Math.log(n) / Math.log(1000)), u.length - 1)
  return `${(n / 1000 ** i).toFixed(i ? 1 : 0)} ${u[i]}`
}

function statsText(s) {
  if (!s) return ''
  const parts = []
  if (s.eval_count != null) {
    parts.push(`${s.eval_count} tokens`)
    if (s.eval_duration > 0) parts.push(`${(s.eval_count / (s.eval_duration / 1e9)).toFixed(1)} tokens/s`)
  }
  if (s.ttft_ms != null) parts.push(`first token ${Math.round(s.ttft_ms)} ms`)
  if (s.prompt_eval_count != null) {
    let p = `prompt ${s.prompt_eval_count} tokens`
    if (s.prompt_cached_count != null) p += ` (${s.prompt_cached_count} from cache)`
    parts.push(p)
  }
  return parts.join(' · ')
}

function renderMessage(m, el) {
  el = el || document.createElement('div')
  el.className = `msg ${m.role}`
  el.replaceChildren()
  const who = document.createElement('div')
  who.className = 'who'
  who.textContent = m.role === 'user' ? 'You' : (m.model || 'assistant')
  el.append(who)
  if (m.thinking) {
    const d = document.createElement('details')
    d.className = 'thinking'
    d.open = !!m.thinkingOpen
    d.addEventListener('toggle', () => { m.thinkingOpen = d.open })
    const s = document.createElement('summary')
    s.textContent = m.streaming && !m.content ? 'Thinking…' : 'Thought'
    const body = document.createElement('div')
    body.textContent = m.thinking
    d.append(s, body)
    el.append(d)
  }
  const body = document.createElement('div')
  body.className = 'body'
  if (m.role === 'user') { body.style.whiteSpace = 'pre-wrap'; body.textContent = m.content }
  else body.innerHTML = renderMarkdown(m.content || '') // escaped inside
  el.append(body)
  if (m.error) {
    const e = document.createElement('div')
    e.className = 'error'
    e.textContent = m.error
    el.append(e)
  }
  if (m.stopped) {
    const e = document.createElement('div')
    e.className = 'stats'
    e.textContent = 'stopped'
    el.append(e)
  }
  if (m.stats) {
    const s = document.createElement('div')
    s.className = 'stats'
    s.textContent = statsText(m.stats)
    el.append(s)
  }
  return el
}

function renderMessages() {
  const box = $('messages')
  box.replaceChildren()
  const c = conv()
  if (!c) return
  for (const m of c.messages) { m._el = renderMessage(m); box.append(m._el) }
  box.scrollTop = box.scrollHeight
}

function renderConversations() {
  const ul = $('conversations')
  ul.replaceChildren()
  for (const c of state.convs) {
    const li = document.createElement('li')
    if (c.id === state.current) li.className = 'current'
    const open = document.createElement('button')
    open.className = 'open'
    open.textContent = c.title
    open.title = c.title
    open.addEventListener('click', () => {
      if (state.busy) stop()
      state.current = c.id
      persist()
      renderAll()
      $('side').classList.remove('open')
    })
    const del = document.createElement('button')
    del.className = 'del'
    del.textContent = '×'
    del.title = 'Delete'
    del.setAttribute('aria-label', `Delete ${c.title}`)
    del.addEventListener('click', () => {
      if (state.busy && c.id === state.current) stop()
      state.convs = state.convs.filter((x) => x !== c)
      if (state.current === c.id) state.current = state.convs[0]?.id ?? null
      persist()
      renderAll()
    })
    li.append(open, del)
    ul.append(li)
  }
}

function renderModelPicker() {
  const sel = $('model')
  const want = conv()?.model || sel.value
  sel.replaceChildren()
  for (const m of state.models) {
    const o = document.createElement('option')
    o.value = o.textContent = m.name
    sel.append(o)
  }
  if (!state.models.length) {
    const o = document.createElement('option')
    o.value = ''
    o.textContent = 'no models: create or pull one'
    sel.append(o)
  }
  if (want && state.models.some((m) => m.name === want)) sel.value = want
}

function renderAll() {
  renderConversations()
  renderModelPicker()
  renderMessages()
}

// ---------------- chat ----------------

function optionsFromSettings() {
  const s = state.settings, o = {}
  if (s.temperature !== '' && s.temperature != null) o.temperature = Number(s.temperature)
  if (s.num_ctx) o.num_ctx = Number(s.num_ctx)
  if (s.num_predict !== '' && s.num_predict != null) o.num_predict = Number(s.num_predict)
  return o
}

function setBusy(b) {
  $('send').hidden = b
  $('stop').hidden = !b
}

let renderQueued = false
function queueRender(m) {
  if (renderQueued) return
  renderQueued = true
  requestAnimationFrame(() => {
    renderQueued = false
    if (m._el) renderMessage(m, m._el)
    const box = $('messages')
    box.scrollTop = box.scrollHeight
  })
}

// Reads an NDJSON response, calling onObj per line.
async function readNdjson(res, onObj) {
  const reader = res.body.getReader()
  const dec = new TextDecoder()
  let buf = ''
  for (;;) {
    const { value, done } = await reader.read()
    if (done) break
    buf += dec.decode(value, { stream: true })
    let nl
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl).trim()
      buf = buf.slice(nl + 1)
      if (line) onObj(JSON.parse(line))
    }
  }
  if (buf.trim()) onObj(JSON.parse(buf))
}

async function errorOf(res) {
  const text = await res.text()
  try { return JSON.parse(text).error || text } catch { return text || res.statusText }
}

async function send() {
  const text = $('input').value
  if (!text.trim() || state.busy) return
  const model = $('model').value
  if (!model) { alert('No model selected: create or pull one first (Models).'); return }
  if (!conv()) newConversation()
  const c = conv()
  c.model = model
  if (!c.messages.length) c.title = text.trim().slice(0, 40)
  c.messages.push({ role: 'user', content: text })
  const reply = { role: 'assistant', content: '', thinking: '', model, streaming: true }
  c.messages.push(reply)
  $('input').value = ''
  persist()
  renderConversations()
  renderMessages()

  const messages = []
  if (state.settings.system) messages.push({ role: 'system', content: state.settings.system })
  for (const m of c.messages) {
    if (m === reply) break
    messages.push({ role: m.role, content: m.content })
  }
  const body = { model, messages, stream: true, options: optionsFromSettings() }
  if (state.settings.think) body.think = true
  const controller = new AbortController()
  state.busy = { controller, msg: reply }
  setBusy(true)
  const t0 = performance.now()
  let ttft = null
  try {
    const res = await fetch('/api/chat', { method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify(body), signal: controller.signal })
    if (!res.ok) throw new Error(`${await errorOf(res)} (HTTP ${res.status})`)
    await readNdjson(res, (o) => {
      if (o.error) { reply.error = o.error; return }
      const msg = o.message || {}
      if ((msg.content || msg.thinking) && ttft == null) ttft = performance.now() - t0
      if (msg.content) reply.content += msg.content
      if (msg.thinking) reply.thinking += msg.thinking
      if (o.done) {
        reply.stats = { eval_count: o.eval_count, eval_duration: o.eval_duration, ttft_ms: ttft,
          prompt_eval_count: o.prompt_eval_count, prompt_cached_count: o.prompt_cached_count,
          done_reason: o.done_reason }
      }
      queueRender(reply)
    })
  } catch (e) {
    if (e.name === 'AbortError') reply.stopped = true
    else reply.error = String(e.message || e)
  } finally {
    reply.streaming = false
    state.busy = null
    setBusy(false)
    persist()
    if (reply._el) renderMessage(reply, reply._el)
    $('input').focus()
  }
}

// Aborting the fetch closes the connection; the server cancels the generation.
function stop() {
  if (state.busy) state.busy.controller.abort()
}

// ---------------- models: tags, ps, create, pull ----------------

async function loadModels() {
  try {
    const res = await fetch('/api/tags')
    if (!res.ok) throw new Error(await errorOf(res))
    state.models = (await res.json()).models || []
    state.models.sort((a, b) => a.name.localeCompare(b.name))
  } catch (e) {
    state.models = []
    console.error('tags:', e)
  }
  renderModelPicker()
}

async function loadPs() {
  const tbody = $('ps').querySelector('tbody')
  tbody.replaceChildren()
  try {
    const res = await fetch('/api/ps')
    if (!res.ok) throw new Error(await errorOf(res))
    const models = (await res.json()).models || []
    if (!models.length) {
      const tr = document.createElement('tr')
      const td = document.createElement('td')
      td.colSpan = 4
      td.textContent = 'none loaded'
      tr.append(td)
      tbody.append(tr)
    }
    for (const m of models) {
      const tr = document.createElement('tr')
      const until = m.expires_at ? new Date(m.expires_at).toLocaleTimeString() : ''
      for (const v of [m.name, fmtBytes(m.size), m.context_length ?? '', until]) {
        const td = document.createElement('td')
        td.textContent = v
        tr.append(td)
      }
      tbody.append(tr)
    }
  } catch (e) {
    logLine(`ps: ${e.message || e}`, true)
  }
}

function logLine(text, isError) {
  const log = $('models-log')
  const line = document.createElement('div')
  if (isError) line.className = 'error'
  line.textContent = text
  log.append(line)
  log.scrollTop = log.scrollHeight
}

function showProgress(done, total) {
  const p = $('progress')
  p.hidden = !total
  if (total) { p.max = total; p.value = done }
}

// Streams an NDJSON progress request (create, pull) into the log.
async function progressRequest(what, url, body) {
  const res = await fetch(url, { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify(body) })
  if (!res.ok) throw new Error(`${what}: ${await errorOf(res)} (HTTP ${res.status})`)
  let ok = false, last = ''
  await readNdjson(res, (o) => {
    if (o.error) throw new Error(`${what}: ${o.error}`)
    if (o.total) showProgress(o.completed || 0, o.total)
    if (o.status && o.status !== last) { logLine(o.status); last = o.status }
    if (o.status === 'success') ok = true
  })
  showProgress(0, 0)
  if (!ok) throw new Error(`${what}: the server ended without success`)
}

async function uploadBlob(file) {
  const h = new Sha256()
  const chunk = 8 << 20
  for (let off = 0; off < file.size; off += chunk) {
    h.update(new Uint8Array(await file.slice(off, off + chunk).arrayBuffer()))
    showProgress(Math.min(off + chunk, file.size), file.size)
  }
  const digest = `sha256:${h.hex()}`
  logLine(`${file.name}: ${digest}`)
  const head = await fetch(`/api/blobs/${digest}`, { method: 'HEAD' })
  if (head.status === 200) {
    logLine('the server has this file already')
  } else {
    logLine(`uploading ${fmtBytes(file.size)}…`)
    const res = await fetch(`/api/blobs/${digest}`, { method: 'POST', body: file })
    if (!res.ok) throw new Error(`upload: ${await errorOf(res)} (HTTP ${res.status})`)
  }
  showProgress(0, 0)
  return digest
}

async function createModel(ev) {
  ev.preventDefault()
  const name = $('create-name').value.trim()
  const file = $('create-file').files[0]
  const from = $('create-from').value.trim()
  $('models-log').replaceChildren()
  try {
    if (!file && !from) throw new Error('choose a GGUF file or name what to create from')
    const body = { model: name, stream: true }
    if (file) body.files = { [file.name]: await uploadBlob(file) }
    else body.from = from
    await progressRequest('create', '/api/create', body)
    await loadModels()
    const created = state.models.find((m) => m.name === name || m.name === `${name}:latest`)
    if (created) { $('model').value = created.name; modelChanged() }
    logLine(`created ${name}`) // last: once it shows, the new model is listed and selected
  } catch (e) {
    showProgress(0, 0)
    logLine(String(e.message || e), true)
  }
}

async function pullModel(ev) {
  ev.preventDefault()
  const name = $('pull-name').value.trim()
  $('models-log').replaceChildren()
  try {
    await progressRequest('pull', '/api/pull', { model: name, stream: true })
    logLine(`pulled ${name}`)
    await loadModels()
  } catch (e) {
    showProgress(0, 0)
    logLine(String(e.message || e), true)
  }
}

function modelChanged() {
  const c = conv()
  if (c) { c.model = $('model').value; persist() }
}

// ---------------- settings and wiring ----------------

function bindSettings() {
  for (const k of ['system', 'temperature', 'num_ctx', 'num_predict']) {
    $(k).value = state.settings[k] ?? ''
    $(k).addEventListener('input', () => { state.settings[k] = $(k).value; save(SETTINGS, state.settings) })
  }
  $('think').checked = !!state.settings.think
  $('think').addEventListener('change', () => { state.settings.think = $('think').checked; save(SETTINGS, state.settings) })
}

function togglePanel(id) {
  for (const p of ['settings', 'models']) $(p).hidden = p === id ? !$(p).hidden : true
  if (id === 'models' && !$('models').hidden) loadPs()
}

function init() {
  // drop a half-finished reply left by a reload mid-stream
  for (const c of state.convs) for (const m of c.messages) if (m.streaming) { m.streaming = false; m.stopped = true }
  if (!conv()) state.current = state.convs[0]?.id ?? null
  bindSettings()
  $('composer').addEventListener('submit', (e) => { e.preventDefault(); send() })
  $('input').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); send() }
  })
  document.addEventListener('keydown', (e) => { if (e.key === 'Escape' && state.busy) { e.preventDefault(); stop() } })
  $('stop').addEventListener('click', stop)
  $('new-chat').addEventListener('click', () => { if (state.busy) stop(); newConversation(); $('input').focus() })
  $('model').addEventListener('change', modelChanged)
  $('toggle-side').addEventListener('click', () => $('side').classList.toggle('open'))
  // on a phone the list is a drawer over the chat: a tap on the chat closes it
  document.querySelector('.chat').addEventListener('click', () => $('side').classList.remove('open'))
  $('toggle-settings').addEventListener('click', () => togglePanel('settings'))
  $('toggle-models').addEventListener('click', () => togglePanel('models'))
  $('ps-refresh').addEventListener('click', loadPs)
  $('create-form').addEventListener('submit', createModel)
  $('pull-form').addEventListener('submit', pullModel)
  renderAll()
  loadModels().then(() => { renderModelPicker(); document.body.dataset.ready = '1' })
  $('input').focus()
}

init()
