// Drives a running hearth server with the official `openai` and `@anthropic-ai/sdk` npm
// packages (the OpenAI- and Anthropic-compatible endpoints).
// Usage: HEARTH_URL=http://127.0.0.1:PORT node sdk_clients.mjs CHAT_MODEL PLAIN_MODEL
// CHAT_MODEL has a chat template, PLAIN_MODEL none (both stories260K). Exits 0 when every
// check passes; prints each failure otherwise. Run by TEST(compat_npm_openai_anthropic_sdks)
// in tests/test_compat.c.
import OpenAI from 'openai'
import Anthropic from '@anthropic-ai/sdk'
import { check, finish, setup, unexpected } from './harness.mjs'

const { host, args: [chatModel, plainModel] } = setup('sdk_clients.mjs', ['CHAT_MODEL', 'PLAIN_MODEL'])

const openai = new OpenAI({ baseURL: `${host}/v1`, apiKey: 'hearth', maxRetries: 0 })
const anthropic = new Anthropic({ baseURL: host, apiKey: 'hearth', maxRetries: 0 })
const messages = [
  { role: 'system', content: 'You tell stories.' },
  { role: 'user', content: 'Once upon a time' },
]

try {
  // ---- OpenAI ----
  const models = await openai.models.list()
  const ids = []
  for await (const m of models) ids.push(m.id)
  check(ids.includes(`${chatModel}:latest`), `models.list: ${ids}`)
  const one = await openai.models.retrieve(plainModel)
  check(one.id === `${plainModel}:latest` && one.object === 'model', 'models.retrieve')

  const c = await openai.chat.completions.create({ model: chatModel, messages, max_tokens: 8,
                                                   temperature: 0 })
  check(c.id.startsWith('chatcmpl-') && c.object === 'chat.completion', `chat id ${c.id}`)
  check(c.choices[0].message.role === 'assistant', 'chat role')
  const text = c.choices[0].message.content
  check(typeof text === 'string' && text.length > 0, 'chat content')
  check(c.choices[0].finish_reason === 'length', `finish_reason ${c.choices[0].finish_reason}`)
  check(c.usage.completion_tokens === 8, `completion_tokens ${c.usage.completion_tokens}`)
  check(c.usage.total_tokens === c.usage.prompt_tokens + 8, 'total_tokens')

  const stream = await openai.chat.completions.create({
    model: chatModel, messages, max_tokens: 8, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  })
  let streamed = ''
  let finish = null
  let usage = null
  for await (const chunk of stream) {
    if (chunk.choices.length > 0) {
      streamed += chunk.choices[0].delta.content ?? ''
      if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason
    }
    if (chunk.usage) usage = chunk.usage
  }
  check(streamed === text, `streamed text '${streamed}' vs '${text}'`)
  check(finish === 'length', `stream finish_reason ${finish}`)
  check(usage && usage.completion_tokens === 8, 'stream usage')
  check(usage && usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens > 0,
        `cached_tokens on a repeated prompt: ${JSON.stringify(usage)}`)

  const stopped = await openai.chat.completions.create({ model: chatModel, messages,
    max_tokens: 8, temperature: 0, stop: [text.trim().split(' ')[1] ?? 'zzz'] })
  check(stopped.choices[0].finish_reason === 'stop', 'stop -> finish_reason stop')
  check(text.startsWith(stopped.choices[0].message.content), 'stopped text is a prefix')

  const comp = await openai.completions.create({ model: plainModel, prompt: 'Once upon a time',
                                                max_tokens: 5, temperature: 0 })
  check(comp.object === 'text_completion' && comp.choices[0].text.length > 0, 'completions')
  let ctext = ''
  for await (const ch of await openai.completions.create({ model: plainModel,
    prompt: 'Once upon a time', max_tokens: 5, temperature: 0, stream: true })) {
    ctext += ch.choices[0]?.text ?? ''
  }
  check(ctext === comp.choices[0].text, `completions stream '${ctext}'`)

  const emb = await openai.embeddings.create({ model: plainModel, input: ['hello', 'world'] })
  check(emb.data.length === 2 && emb.data[1].index === 1, 'embeddings count')
  check(emb.data[0].embedding.length > 0, 'embedding vector')
  // the SDK asks for base64 by default when encoding_format is not given and decodes it
  const emb64 = await openai.embeddings.create({ model: plainModel, input: 'hello',
                                                encoding_format: 'base64' })
  check(typeof emb64.data[0].embedding === 'string', 'base64 embedding')

  try {
    await openai.chat.completions.create({ model: 'no-such-model', messages })
    check(false, 'unknown model should throw')
  } catch (e) {
    check(e instanceof OpenAI.NotFoundError, `unknown model error: ${e}`)
    check(e.status === 404 && /not found/.test(e.message), `404 message: ${e.message}`)
  }
  try {
    await openai.chat.completions.create({ model: chatModel, messages: [] })
    check(false, 'empty messages should throw')
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError, `empty messages: ${e}`)
  }

  // ---- Anthropic ----
  const system = 'You tell stories.'
  const am = [{ role: 'user', content: 'Once upon a time' }]
  const msg = await anthropic.messages.create({ model: chatModel, max_tokens: 8, system,
                                               messages: am, temperature: 0 })
  check(/^msg_[0-9a-f]{24}$/.test(msg.id) && msg.type === 'message', `message id ${msg.id}`)
  check(msg.content[0].type === 'text' && msg.content[0].text.length > 0, 'message text')
  check(msg.stop_reason === 'max_tokens', `stop_reason ${msg.stop_reason}`)
  check(msg.usage.output_tokens === 8, 'output_tokens')
  const atext = msg.content[0].text

  const events = []
  const s = anthropic.messages.stream({ model: chatModel, max_tokens: 8, system,
                                       messages: am, temperature: 0 })
  s.on('streamEvent', (ev) => events.push(ev.type))
  let astreamed = ''
  s.on('text', (t) => { astreamed += t })
  const final = await s.finalMessage()
  check(astreamed === atext, `anthropic stream text '${astreamed}' vs '${atext}'`)
  check(final.content[0].text === atext, 'finalMessage text')
  check(final.stop_reason === 'max_tokens', `stream stop_reason ${final.stop_reason}`)
  check(final.usage.output_tokens === 8, 'stream output_tokens')
  check(final.usage.cache_read_input_tokens > 0, `cache_read_input_tokens ${JSON.stringify(final.usage)}`)
  check(events[0] === 'message_start' && events[events.length - 1] === 'message_stop',
        `event order ${events}`)
  check(events.includes('content_block_start') && events.includes('content_block_delta') &&
        events.includes('content_block_stop') && events.includes('message_delta'), 'event kinds')

  // raw stream (stream: true) and system as blocks with a Claude Code billing header
  const billing = (v) => [{ type: 'text', text: `x-anthropic-billing-header: cc_version=2.0.1; cch=${v};` },
                          { type: 'text', text: 'You tell stories about Lily and her dog.' }]
  await anthropic.messages.create({ model: chatModel, max_tokens: 4, system: billing('aaa'),
                                   messages: am, temperature: 0 })
  const raw = await anthropic.messages.create({ model: chatModel, max_tokens: 4,
    system: billing('bbb'), messages: am, temperature: 0, stream: true })
  let cacheRead = -1
  for await (const ev of raw) {
    if (ev.type === 'message_delta') cacheRead = ev.usage.cache_read_input_tokens
  }
  check(cacheRead > 10, `billing header change still hits the cache: ${cacheRead}`)

  const count = await anthropic.messages.countTokens({ model: chatModel, system, messages: am })
  check(count.input_tokens === msg.usage.input_tokens + msg.usage.cache_read_input_tokens,
        `count_tokens ${count.input_tokens}`)

  try {
    await anthropic.messages.create({ model: 'no-such-model', max_tokens: 5, messages: am })
    check(false, 'unknown model should throw')
  } catch (e) {
    check(e instanceof Anthropic.NotFoundError, `anthropic unknown model: ${e}`)
  }
  try {
    await anthropic.messages.create({ model: chatModel, max_tokens: 0, messages: am })
    check(false, 'max_tokens 0 should throw')
  } catch (e) {
    check(e instanceof Anthropic.BadRequestError && /max_tokens/.test(e.message),
          `max_tokens error: ${e}`)
  }
} catch (e) {
  unexpected(e)
}
finish()
