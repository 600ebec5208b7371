// Drives hearth's chat page (GET /) in headless Chromium with playwright-core.
// Usage: HEARTH_URL=http://127.0.0.1:PORT WEBUI_SCREENSHOTS=DIR node webui.mjs MODEL GGUF
// MODEL exists already (stories260K); the page itself creates a second model "b" from
// GGUF. The server runs with slow tokens and one slot (see TEST(webui_browser_...) in
// tests/test_webui.c). Exits 0 when every check passes; prints each failure otherwise.
import { chromium } from 'playwright-core'
import { check, finish, setup, unexpected } from './harness.mjs'

const { host: base, args: [model, gguf] } = setup('webui.mjs', ['MODEL', 'GGUF'])
const shots = process.env.WEBUI_SCREENSHOTS || '.'

const browser = await chromium.launch({ executablePath: '/usr/bin/chromium', args: ['--no-sandbox'] })
const page = await browser.newPage({ viewport: { width: 1280, height: 800 } })
const pageErrors = []
page.on('pageerror', (e) => pageErrors.push(String(e)))
page.on('console', (m) => { if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) pageErrors.push(m.text()) })

const lastReply = () => page.locator('.msg.assistant').last()
async function setOption(id, value) {
  await page.click('#toggle-settings')
  await page.fill(`#${id}`, String(value))
  await page.click('#toggle-settings')
}
async function waitDone(timeout = 20000) {
  await page.locator('#send').waitFor({ state: 'visible', timeout })
}

try {
  await page.goto(`${base}/`)
  await page.waitForSelector('body[data-ready="1"]')
  const options = await page.locator('#model option').allTextContents()
  check(options.includes(`${model}:latest`), `the picker lists ${model}: ${options}`)

  // the renderer escapes model text and keeps only safe markup; the hash matches sha256
  const md = await page.evaluate(() => renderMarkdown(
    '<img src=x onerror=alert(1)> **b** `<i>` [ok](https://x.test/a) [bad](javascript:alert(1))\n' +
    '- one\n- two\n\n```c\nint <x>;\n```'))
  check(!md.includes('<img') && md.includes('&lt;img'), `raw HTML escaped: ${md}`)
  check(md.includes('<strong>b</strong>') && md.includes('<code>&lt;i&gt;</code>'), `inline markup: ${md}`)
  check(md.includes('<a href="https://x.test/a"') && !md.includes('javascript:alert(1)"'), `links: ${md}`)
  check(md.includes('<ul><li>one</li><li>two</li></ul>'), `lists: ${md}`)
  check(md.includes('<pre><code class="language-c">int &lt;x&gt;;</code></pre>'), `code fence: ${md}`)
  const think = await page.evaluate(() => {
    const el = renderMessage({ role: 'assistant', model: 'x', thinking: 'Let me <think>', content: '**Hi**' })
    const d = el.querySelector('details.thinking')
    return { open: d && d.open, summary: d && d.querySelector('summary').textContent,
      text: d && d.querySelector('div').textContent, body: el.querySelector('.body').innerHTML }
  })
  check(think.summary === 'Thought' && think.open === false && think.text === 'Let me <think>' &&
        think.body === '<p><strong>Hi</strong></p>', `thinking is a collapsed section: ${JSON.stringify(think)}`)
  const sha = await page.evaluate(() => { const h = new Sha256(); h.update(new TextEncoder().encode('abc')); return h.hex() })
  check(sha === 'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad', `sha256("abc") = ${sha}`)

  // 1. a streamed reply: the reply's text is seen growing before it is done
  await page.selectOption('#model', `${model}:latest`)
  await setOption('num_predict', 16)
  await page.evaluate(() => {
    window.__lens = []
    new MutationObserver(() => {
      const b = document.querySelector('.msg.assistant:last-child .body')
      if (b && !document.getElementById('stop').hidden) window.__lens.push(b.textContent.length)
    }).observe(document.getElementById('messages'), { childList: true, subtree: true, characterData: true })
  })
  await page.fill('#input', 'Once upon a time')
  await page.press('#input', 'Enter')
  await page.locator('#stop').waitFor({ state: 'visible' })
  await waitDone()
  const lens = [...new Set(await page.evaluate(() => window.__lens.filter((n) => n > 0)))]
  check(lens.length >= 2, `the reply streamed in pieces (lengths seen: ${lens})`)
  const stats = await lastReply().locator('.stats').textContent()
  check(/16 tokens · [\d.]+ tokens\/s · first token \d+ ms · prompt \d+ tokens \(\d+ from cache\)/.test(stats), `stats: ${stats}`)
  check((await lastReply().locator('.body').textContent()).length > 0, 'the reply has text')
  check((await lastReply().locator('.who').textContent()) === `${model}:latest`, 'the reply names its model')
  // a second turn reuses the first one's prompt from the cache
  await page.fill('#input', 'The dog')
  await page.press('#input', 'Enter')
  await waitDone()
  const stats2 = await lastReply().locator('.stats').textContent()
  const cached = Number((stats2.match(/\((\d+) from cache\)/) || [])[1])
  check(cached > 0, `the second turn is served partly from the cache: ${stats2}`)
  await page.screenshot({ path: `${shots}/desktop-chat.png` })

  // 2. stop a long generation (2000 tokens at 20 ms each would take 40 s)
  await setOption('num_predict', 2000)
  await page.fill('#input', 'Tell me a very long story')
  await page.press('#input', 'Enter')
  await page.waitForFunction(() => (document.querySelector('.msg.assistant:last-child .body')?.textContent || '').length > 20)
  await page.screenshot({ path: `${shots}/desktop-streaming.png` })
  await page.click('#stop')
  await waitDone(5000)
  check(await lastReply().locator('.stats', { hasText: 'stopped' }).count() === 1, 'the reply is marked stopped')
  // the server cancelled it: with one slot, the next request runs at once
  await setOption('num_predict', 4)
  const t0 = Date.now()
  await page.fill('#input', 'And then?')
  await page.press('#input', 'Enter')
  await page.locator('#stop').waitFor({ state: 'visible' })
  await waitDone(15000)
  const waited = Date.now() - t0
  check(waited < 10000, `the request after Stop was served in ${waited} ms (not after the 40 s generation)`)
  check(/4 tokens/.test(await lastReply().locator('.stats').textContent()), 'the follow-up completed')
  // Esc stops too
  await setOption('num_predict', 2000)
  await page.fill('#input', 'Another long one')
  await page.press('#input', 'Enter')
  await page.waitForFunction(() => (document.querySelector('.msg.assistant:last-child .body')?.textContent || '').length > 5)
  await page.keyboard.press('Escape')
  await waitDone(5000)
  check(await lastReply().locator('.stats', { hasText: 'stopped' }).count() === 1, 'Esc stopped the reply')
  const ps = await (await fetch(`${base}/api/ps`)).json()
  check(ps.models.some((m) => m.name === `${model}:latest`), 'the model is loaded (/api/ps)')

  // 3. create a second model from the GGUF in the page (hash, HEAD, create), switch to it
  await page.click('#toggle-models')
  await page.locator('#ps tbody tr', { hasText: `${model}:latest` }).waitFor()
  await page.fill('#create-name', 'b')
  await page.setInputFiles('#create-file', gguf)
  await page.click('#create-form button[type=submit]')
  await page.locator('#models-log', { hasText: 'created b' }).waitFor({ timeout: 20000 })
  check(await page.inputValue('#model') === 'b:latest', 'the new model is selected')
  // pull: the server's answer is shown (501 until pulling exists, or a 404 for an unknown name)
  await page.fill('#pull-name', 'no-such-model-xyz')
  await page.click('#pull-form button[type=submit]')
  const pullErr = page.locator('#models-log .error')
  await pullErr.waitFor()
  const pullText = await pullErr.textContent()
  check(/^pull: .+/.test(pullText), `pull error shown: ${pullText}`)
  await page.screenshot({ path: `${shots}/desktop-models.png` })
  await page.click('#toggle-models')
  await setOption('num_predict', 6)
  await page.fill('#input', 'Hello from b')
  await page.press('#input', 'Enter')
  await waitDone()
  check((await lastReply().locator('.who').textContent()) === 'b:latest', 'the reply came from b')
  const nMsgs = await page.locator('.msg').count()

  // 4. reload: the conversation, its model and its stats are still there
  await page.reload()
  await page.waitForSelector('body[data-ready="1"]')
  check(await page.locator('.msg').count() === nMsgs, `the conversation is back after reload (${nMsgs} messages)`)
  check(await page.locator('#conversations li.current', { hasText: 'Once upon a time' }).count() === 1, 'it is listed by its title')
  check(await page.inputValue('#model') === 'b:latest', 'its model is selected again')
  check((await lastReply().locator('.stats').textContent()).includes('tokens/s'), 'stats survive the reload')
  // a new conversation, then back to the first one
  await page.click('#new-chat')
  check(await page.locator('.msg').count() === 0, 'a new conversation is empty')
  await page.locator('#conversations li', { hasText: 'Once upon a time' }).locator('button.open').click()
  check(await page.locator('.msg').count() === nMsgs, 'switching back shows it again')

  // 5. a phone: one column, nothing wider than the screen
  await page.setViewportSize({ width: 390, height: 844 })
  await page.waitForTimeout(100)
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth)
  check(overflow <= 0, `no horizontal scrolling on a phone (overflow ${overflow}px)`)
  await page.screenshot({ path: `${shots}/phone-chat.png` })
  const barHeight = await page.evaluate(() => document.querySelector('.bar').getBoundingClientRect().height)
  check(barHeight <= 48, `the phone's top bar is one row (${barHeight}px)`)
  await page.click('#toggle-side')
  await page.screenshot({ path: `${shots}/phone-conversations.png` })
  await page.locator('#conversations li', { hasText: 'Once upon a time' }).locator('button.open').click()
  check(!(await page.locator('#side').isVisible()), 'picking a conversation closes the drawer')
  await page.click('#toggle-models')
  await page.screenshot({ path: `${shots}/phone-models.png` })
  check(pageErrors.length === 0, `no errors in the page: ${pageErrors.join(' | ')}`)
} catch (e) {
  unexpected(e)
  try { await page.screenshot({ path: `${shots}/failure.png` }) } catch {}
} finally {
  await browser.close()
}
finish()
