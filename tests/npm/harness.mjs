// harness.mjs - the frame the client scripts here share: the server's URL (HEARTH_URL)
// and the script's arguments, with the usage and exit status 2 when one is missing;
// check() and unexpected() count failures and print each; finish() ends the run: exit 1
// with the count when anything failed, else 'ok' and exit 0.
let failures = 0

export function setup(script, argNames) {
  const host = process.env.HEARTH_URL
  const args = process.argv.slice(2)
  if (!host || argNames.some((_, i) => !args[i])) {
    console.error(`usage: HEARTH_URL=http://host:port node ${script} ${argNames.join(' ')}`)
    process.exit(2)
  }
  return { host, args }
}

export function check(cond, what) {
  if (!cond) {
    failures++
    console.error(`FAIL: ${what}`)
  }
}

export function unexpected(e) {
  failures++
  console.error(`FAIL: unexpected error: ${e && e.stack ? e.stack : e}`)
}

export function finish() {
  if (failures) {
    console.error(`${failures} check(s) failed`)
    process.exit(1)
  }
  console.log('ok')
  process.exit(0)
}
