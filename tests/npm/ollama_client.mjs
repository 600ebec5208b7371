// Drives a running hearth server with the official `ollama` npm client.
// Usage: HEARTH_URL=http://127.0.0.1:PORT node ollama_client.mjs MODEL
// MODEL must already exist (stories260K). Exits 0 when every check passes; prints each
// failure otherwise. Run by TEST(api_npm_ollama_client) in tests/test_api.c.
import { Ollama } from 'ollama'
import { check, finish, setup, unexpected } from './harness.mjs'

const { host, args: [model] } = setup('ollama_client.mjs', ['MODEL'])
const ollama = new Ollama({ host })

const opts = { temperature: 0, num_predict: 10 }
try {
  const list = await ollama.list()
  check(list.models.some((m) => m.name === `${model}:latest`), 'list shows the model')

  const show = await ollama.show({ model })
  check(show.details && show.details.format === 'gguf', 'show has details')
  check(typeof show.modelfile === 'string' && show.modelfile.includes('FROM'), 'show has a modelfile')

  const created = await ollama.create({ model: `${model}-js`, from: model, system: 'You tell stories.',
                                        parameters: { temperature: 0 } })
  check(created.status === 'success', `create (non-stream): ${JSON.stringify(created)}`)
  const progress = await ollama.create({ model: `${model}-js2`, from: model, stream: true })
  let last = null
  for await (const p of progress) last = p
  check(last && last.status === 'success', 'create (stream) ends with success')
  const shown = await ollama.show({ model: `${model}-js` })
  check(shown.system === 'You tell stories.', 'created model keeps its system')

  const gen = await ollama.generate({ model, prompt: 'Once upon a time', raw: true, options: opts })
  check(gen.done === true && gen.done_reason === 'length', 'generate (non-stream) done')
  check(gen.eval_count === 10, `generate eval_count ${gen.eval_count}`)
  check(typeof gen.response === 'string' && gen.response.length > 0, 'generate response text')
  check(gen.created_at instanceof Date || typeof gen.created_at === 'string', 'created_at')

  let streamed = ''
  let chunks = 0
  let final = null
  for await (const part of await ollama.generate({ model, prompt: 'Once upon a time', raw: true,
                                                   options: opts, stream: true })) {
    streamed += part.response
    chunks++
    if (part.done) final = part
  }
  check(streamed === gen.response, `generate (stream) text equals non-stream: ${JSON.stringify(streamed)}`)
  check(chunks > 2 && final && final.eval_count === 10, 'generate (stream) chunks and final stats')

  const messages = [{ role: 'user', content: 'Once upon a time' }]
  const chat = await ollama.chat({ model, messages, options: opts })
  check(chat.message.role === 'assistant' && chat.message.content.length > 0, 'chat (non-stream)')
  let chatText = ''
  for await (const part of await ollama.chat({ model, messages, options: opts, stream: true }))
    chatText += part.message.content
  check(chatText === chat.message.content, 'chat (stream) text equals non-stream')

  const emb = await ollama.embed({ model, input: ['a', 'b'] })
  check(emb.embeddings.length === 2 && emb.embeddings[0].length > 0, 'embed')

  const ps = await ollama.ps()
  check(ps.models.length === 1 && ps.models[0].context_length > 0, 'ps')

  // abort a long stream mid-way; the server stays usable
  const long = await ollama.generate({ model, prompt: 'Once', raw: true, stream: true,
                                       options: { num_predict: -1 } })
  let n = 0
  try {
    for await (const part of long) {
      if (++n === 3) long.abort()
    }
  } catch (e) {
    check(e.name === 'AbortError', `abort raises AbortError, got ${e.name}`)
  }
  const again = await ollama.generate({ model, prompt: 'Once', raw: true, options: { num_predict: 2 } })
  check(again.eval_count === 2, 'a request after an abort works')

  try {
    await ollama.generate({ model: 'no-such-model', prompt: 'x' })
    check(false, 'unknown model must fail')
  } catch (e) {
    check(e.status_code === 404, `unknown model: status ${e.status_code}`)
    check(e.error === "model 'no-such-model' not found", `unknown model: ${e.error}`)
  }
  await ollama.delete({ model: `${model}-js` })
  await ollama.delete({ model: `${model}-js2` })
  const after = await ollama.list()
  check(!after.models.some((m) => m.name.startsWith(`${model}-js`)), 'delete')
} catch (e) {
  unexpected(e)
}
finish()
