// Structured outputs through the official clients: the `openai` package's parse helper
// (chat.completions.parse with zodResponseFormat) and the `ollama` package with a JSON
// schema in `format` (from zod's z.toJSONSchema). Every answer must parse and validate
// against the zod schema; the grammar only lets the model write such objects.
// Usage: HEARTH_URL=http://127.0.0.1:PORT node structured.mjs MODEL
// Run by TEST(api_npm_structured_outputs) in tests/test_api_schema.c.
import OpenAI from 'openai'
import { zodResponseFormat } from 'openai/helpers/zod'
import { Ollama } from 'ollama'
import { z } from 'zod'
import { check, finish, setup, unexpected } from './harness.mjs'

const { host, args: [model] } = setup('structured.mjs', ['MODEL'])

const Person = z.object({
  name: z.string().max(12),
  age: z.number().int(),
  mood: z.enum(['happy', 'sad']),
  pets: z.array(z.object({ kind: z.enum(['cat', 'dog']), legs: z.number().int().min(0).max(4) })).max(2),
  nick: z.string().max(6).nullable(),
})
const messages = [{ role: 'user', content: 'Once upon a time there was a girl. Describe her.' }]

try {
  const openai = new OpenAI({ baseURL: `${host}/v1`, apiKey: 'hearth', maxRetries: 0 })
  for (let seed = 1; seed <= 3; seed++) {
    const c = await openai.chat.completions.parse({
      model, messages, temperature: 1, seed, max_tokens: 1500,
      response_format: zodResponseFormat(Person, 'person'),
    })
    const msg = c.choices[0].message
    check(msg.parsed !== null && typeof msg.parsed === 'object', `openai parse: ${msg.content}`)
    check(Person.safeParse(msg.parsed).success, `openai parsed fails the schema: ${msg.content}`)
    check(c.choices[0].finish_reason === 'stop', `openai finish_reason ${c.choices[0].finish_reason}`)
  }
  // json_object mode: any JSON object
  const j = await openai.chat.completions.create({
    model, messages, temperature: 1, seed: 7, max_tokens: 40,
    response_format: { type: 'json_object' },
  })
  check(j.choices[0].message.content.trimStart().startsWith('{'), `json_object: ${j.choices[0].message.content}`)

  const ollama = new Ollama({ host })
  const schema = z.toJSONSchema(Person)
  for (let seed = 1; seed <= 3; seed++) {
    const r = await ollama.chat({ model, messages, format: schema, options: { temperature: 1, seed, num_predict: 1500 } })
    let v = null
    try { v = JSON.parse(r.message.content) } catch (e) { check(false, `ollama chat: not JSON: ${r.message.content}`) }
    check(v !== null && Person.safeParse(v).success, `ollama chat fails the schema: ${r.message.content}`)
    check(r.done_reason === 'stop', `ollama done_reason ${r.done_reason}`)
    const g = await ollama.generate({ model, prompt: 'Once upon a time', format: schema, options: { temperature: 1, seed, num_predict: 1500 } })
    let w = null
    try { w = JSON.parse(g.response) } catch (e) { check(false, `ollama generate: not JSON: ${g.response}`) }
    check(w !== null && Person.safeParse(w).success, `ollama generate fails the schema: ${g.response}`)
  }
  // a schema the grammar cannot enforce is a 400 naming the keyword
  try {
    await ollama.generate({ model, prompt: 'x', format: { type: 'string', pattern: '(?=a)b' } })
    check(false, 'pattern accepted')
  } catch (e) {
    check(/pattern/.test(String(e.message)), `pattern error: ${e.message}`)
  }
} catch (e) {
  unexpected(e)
}
finish()
