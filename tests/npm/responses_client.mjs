// Drives a running hearth server's /v1/responses with the official `openai` npm package:
// responses.create and responses.stream on a text model, and a function-call round trip
// on a model that calls tools (test_compat.c's "toolbot").
// Usage: HEARTH_URL=http://127.0.0.1:PORT node responses_client.mjs CHAT_MODEL TOOL_MODEL
// Exits 0 when every check passes; prints each failure otherwise. Run by
// TEST(compat_npm_openai_responses) in tests/test_compat.c.
import OpenAI from 'openai'
import { check, finish, setup, unexpected } from './harness.mjs'

const { host, args: [chatModel, toolModel] } = setup('responses_client.mjs', ['CHAT_MODEL', 'TOOL_MODEL'])

const openai = new OpenAI({ baseURL: `${host}/v1`, apiKey: 'hearth', maxRetries: 0 })

try {
  // ---- text: create and stream ----
  const params = { model: chatModel, instructions: 'You tell stories.', input: 'Once upon a time',
                   max_output_tokens: 8, temperature: 0 }
  const r = await openai.responses.create(params)
  check(r.id.startsWith('resp_') && r.object === 'response', `response id ${r.id} ${r.object}`)
  check(r.status === 'completed', `status ${r.status}`)
  check(r.model === chatModel, `model ${r.model}`)
  check(r.output.length === 1 && r.output[0].type === 'message', `output ${JSON.stringify(r.output)}`)
  const text = r.output_text
  check(typeof text === 'string' && text.length > 0, `output_text '${text}'`)
  check(r.usage.output_tokens === 8, `output_tokens ${r.usage.output_tokens}`)
  check(r.usage.total_tokens === r.usage.input_tokens + 8, 'total_tokens')

  const s = openai.responses.stream(params)
  const types = []
  let deltas = ''
  s.on('event', (e) => types.push(e.type))
  s.on('response.output_text.delta', (e) => { deltas += e.delta })
  const fin = await s.finalResponse()
  check(deltas === text, `streamed '${deltas}' vs '${text}'`)
  // (finalResponse() adds no output_text convenience field unless it parses a format)
  const finText = fin.output[0] && fin.output[0].content[0].text
  check(finText === text, `finalResponse text '${finText}'`)
  check(fin.status === 'completed', `stream status ${fin.status}`)
  check(types[0] === 'response.created' && types[1] === 'response.in_progress' &&
        types[types.length - 1] === 'response.completed', `event order ${types}`)
  for (const t of ['response.output_item.added', 'response.content_part.added',
                   'response.output_text.done', 'response.content_part.done',
                   'response.output_item.done']) {
    check(types.includes(t), `stream lacks ${t}: ${types}`)
  }
  check(fin.usage.input_tokens_details.cached_tokens > 0,
        `cached_tokens on a repeated prompt: ${JSON.stringify(fin.usage)}`)

  // raw stream (stream: true): the same events, sequence numbers in order
  let seq = -1
  let ordered = true
  let raw = ''
  for await (const ev of await openai.responses.create({ ...params, stream: true })) {
    ordered = ordered && ev.sequence_number === seq + 1
    seq = ev.sequence_number
    if (ev.type === 'response.output_text.delta') raw += ev.delta
  }
  check(ordered, 'sequence_number increases by one')
  check(raw === text, `raw stream text '${raw}'`)

  // ---- a function call round trip ----
  const tools = [{ type: 'function', name: 'get_weather', description: 'Current weather in a city',
                   parameters: { type: 'object', properties: { city: { type: 'string' } },
                                 required: ['city'] }, strict: false }]
  const input = [{ role: 'user', content: 'What is the weather in Paris?' }]
  const r1 = await openai.responses.create({ model: toolModel, input, tools })
  const call = r1.output.find((o) => o.type === 'function_call')
  check(call && call.name === 'get_weather', `function call ${JSON.stringify(r1.output)}`)
  check(call && call.call_id.startsWith('call_'), 'call_id')
  check(call && JSON.parse(call.arguments).city === 'Paris', `arguments ${call && call.arguments}`)
  check(r1.output_text === '', `no text with the call: '${r1.output_text}'`)
  // the application runs the tool and sends the call and its result back
  input.push(...r1.output)
  input.push({ type: 'function_call_output', call_id: call.call_id,
               output: JSON.stringify({ sky: 'sunny', celsius: 21 }) })
  const r2 = await openai.responses.create({ model: toolModel, input, tools })
  check(r2.output_text === 'It is sunny.', `answer after the tool result '${r2.output_text}'`)

  // the same call streamed
  const s2 = openai.responses.stream({ model: toolModel, input: input.slice(0, 1), tools })
  let argsDone = null
  let added = null
  s2.on('response.output_item.added', (e) => { added = e.item })
  s2.on('response.function_call_arguments.done', (e) => { argsDone = e.arguments })
  const f2 = await s2.finalResponse()
  check(added && added.type === 'function_call', `output_item.added ${JSON.stringify(added)}`)
  check(argsDone === '{"city":"Paris"}', `function_call_arguments.done ${argsDone}`)
  check(f2.output[0].type === 'function_call' && f2.output[0].name === 'get_weather',
        `streamed final output ${JSON.stringify(f2.output)}`)

  // ---- errors ----
  try {
    await openai.responses.create({ model: 'no-such-model', input: 'x' })
    check(false, 'unknown model should throw')
  } catch (e) {
    check(e instanceof OpenAI.NotFoundError, `unknown model error: ${e}`)
  }
  try {
    await openai.responses.create({ model: chatModel, input: 'x', previous_response_id: r.id })
    check(false, 'previous_response_id should throw')
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && /previous_response_id/.test(e.message),
          `previous_response_id error: ${e}`)
  }
} catch (e) {
  unexpected(e)
}
finish()
