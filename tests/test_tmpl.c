/* Tests for src/tmpl: the Jinja2 chat-template interpreter. Expected strings in the tables
 * below were produced here with Python jinja2 3.1.6 set up like transformers'
 * apply_chat_template (sandboxed, trim_blocks, lstrip_blocks, loopcontrols, tojson as
 * json.dumps(ensure_ascii=False)). */
#include "test.h"

#include <dirent.h>
#include <pthread.h>
#include <stdlib.h>

#include "base/file.h"
#include "tmpl/tmpl.h"

typedef struct render_case {
    const char *src, *expected;
} render_case;

/* Compiles and renders src with the JSON context text; *out is malloc'd on success. */
static hl_status render_text(const char *src, const char *ctx_text, const tmpl_limits *lim,
                             char **out, hl_err *err) {
    *out = NULL;
    tmpl *t;
    hl_status st = tmpl_compile(src, strlen(src), &t, err);
    if (st) return st;
    json_t *ctx = NULL;
    if (ctx_text) {
        json_error_t je;
        ctx = json_loads(ctx_text, 0, &je);
        if (!ctx) {
            tmpl_destroy(t);
            return hl_fail(err, HL_ERR_INVALID, "bad test context: %s", je.text);
        }
    }
    size_t n;
    st = lim ? tmpl_render_limited(t, ctx, lim, out, &n, err) : tmpl_render(t, ctx, out, &n, err);
    json_decref(ctx);
    tmpl_destroy(t);
    return st;
}

static void run_cases(const render_case *cases, size_t n, const char *ctx) {
    for (size_t i = 0; i < n; i++) {
        char *out;
        hl_err err;
        hl_status st = render_text(cases[i].src, ctx, NULL, &out, &err);
        if (st) {
            test_fail_at(__FILE__, __LINE__, "case %zu (%s) failed: %s", i, cases[i].src, err.msg);
            continue;
        }
        if (strcmp(out, cases[i].expected) != 0)
            test_fail_at(__FILE__, __LINE__, "case %zu (%s):\n  got      \"%s\"\n  expected \"%s\"", i,
                         cases[i].src, out, cases[i].expected);
        free(out);
    }
}

/* Renders src and checks it fails with code and a message containing want. */
#define CHECK_FAILS(src, ctx, code, want)                                                  \
    do {                                                                                    \
        char *out_;                                                                         \
        hl_err err_;                                                                        \
        hl_status st_ = render_text((src), (ctx), NULL, &out_, &err_);                      \
        if (st_ == HL_OK) free(out_);                                                       \
        CHECK_MSG(st_ == (code), "%s: status %d, want %d (%s)", (src), (int)st_, (int)(code), \
                  st_ ? err_.msg : "ok");                                                   \
        CHECK_MSG(strstr(err_.msg, (want)) != NULL, "%s: message \"%s\" lacks \"%s\"", (src), \
                  err_.msg, (want));                                                        \
    } while (0)

#define CHECK_RENDERS(src, ctx, want)                                                      \
    do {                                                                                    \
        char *out_;                                                                         \
        hl_err err_;                                                                        \
        CHECK_OK(render_text((src), (ctx), NULL, &out_, &err_), &err_);                     \
        CHECK_MSG(strcmp(out_, (want)) == 0, "%s: got \"%s\" want \"%s\"", (src), out_, (want)); \
        free(out_);                                                                         \
    } while (0)

static const char *const unit_ctx = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"x\": {\"a\": 1, \"items\": [1, 2], \"b\": null, \"s\": \" Hi There \"}, \"l\": [3, 1, 2], \"s\": \"ab c\", \"u\": \"h\xc3\xa9""llo w\xc3\xb6""rld\", \"n\": null, \"f\": 2.5, \"i\": 7, \"t\": true, \"ms\": [{\"name\": \"b\", \"v\": 2, \"t\": \"x\"}, {\"name\": \"a\", \"v\": 1}, {\"name\": \"C\", \"v\": 3, \"t\": \"y\"}]}";

static const render_case filters_cases[] = {
    {"{{ x.items()|list }}{{ (1,) }}{{ (1,2) }}{{ x.keys()|list }}{{ x.values()|list }}",
     "[('a', 1), ('items', [1, 2]), ('b', None), ('s', ' Hi There ')](1,)(1, 2)['a', 'items', 'b', 's'][1, [1, 2], None, ' Hi There ']"},
    {"{{ none.x }}|{{ x.b }}|{{ x.zz }}|{{ x[\"zz\"] }}|{{ [1][5] }}|{{ l[-1] }}{{ l[1:] }}{{ l[::-1] }}{{ s[::-1] }}{{ u[1:3] }}{{ u[-2] }}",
     "|None||||2[1, 2][2, 1, 3]c ba\xc3\xa9""ll"},
    {"{{ [] | first }}{{ l|first }}{{ l|last }}{{ s|first }}",
     "32a"},
    {"{{ [3,1,2]|sort }}{{ [\"b\",\"A\",\"a\"]|sort }}{{ [\"b\",\"A\",\"a\"]|unique|list }}{{ l|sort(reverse=true) }}{{ ms|sort(attribute='name')|map(attribute='v')|list }}{{ [\"b\",\"A\",\"a\"]|sort(case_sensitive=true) }}",
     "[1, 2, 3]['A', 'a', 'b']['b', 'A'][3, 2, 1][1, 2, 3]['A', 'a', 'b']"},
    {"{{ x|dictsort }}{{ {\"b\":1,\"A\":2,\"a\":3}|dictsort }}{{ {\"b\":1,\"A\":0}|dictsort(by='value') }}{{ {\"b\":1,\"a\":2}|dictsort(reverse=true) }}",
     "[('a', 1), ('b', None), ('items', [1, 2]), ('s', ' Hi There ')][('A', 2), ('a', 3), ('b', 1)][('A', 0), ('b', 1)][('b', 1), ('a', 2)]"},
    {"{% for a in [1,2,3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('a','b') }}|{% endfor %}",
     "1032TrueFalse32a|2121FalseFalse313b|3210FalseTrue32a|"},
    {"{{ 3.0|int }}{{ \"3.7\"|int }}{{ \"x\"|int }}{{ 2.5|round }}{{ 3.14159|round(2) }}{{ -3|abs }}{{ \"12\"|int + 1 }}{{ \"0x1A\"|int(base=16) }}{{ \"1.5\"|float }}{{ \"a\"|float }}{{ 2.675|round(2) }}{{ 3.5|round }}{{ 2.4|round(0,'ceil') }}{{ 1|float }}",
     "3302.03.14313261.50.02.674.03.01.0"},
    {"{{ \"hello world\"|title }}{{ \"hELLO\"|capitalize }}{{ u|upper }}{{ \"\xc3\x80""B\"|lower }}{{ \"they're bill's\"|title }}{{ \"a-b c_d\"|title }}",
     "Hello WorldHelloH\xc3\x89""LLO W\xc3\x96""RLD\xc3\xa0""bThey're Bill'sA-B C_d"},
    {"{% for a in l %}{% if a == 1 %}{% break %}{% endif %}{{ a }}{% endfor %}|{% for a in l %}{% if a == 1 %}{% continue %}{% endif %}{{ a }}{% endfor %}",
     "3|32"},
    {"{% set y %}hello {{ s }}{% endset %}[{{ y }}]{% set z | upper %}abc{% endset %}{{ z }}",
     "[hello ab c]ABC"},
    {"{% macro m(a, b=2, c=none) %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}{{ m(1) }}|{{ m(1, 3) }}|{{ m(1, c=5) }}|{{ m(a=9) }}|{{ m() }}",
     "1-2-None|1-3-None|1-2-5|9-2-None|-2-None"},
    {"{{ x | tojson }}{{ \"\xc3\xa9""\\n\\\"\\\\\\u0001\"|tojson }}{{ l|tojson(indent=2) }}{{ x|tojson(indent=2) }}{{ {}|tojson(indent=2) }}{{ []|tojson }}{{ f|tojson }}{{ none|tojson }}{{ t|tojson }}{{ \"\xc3\xa9""\"|tojson(ensure_ascii=true) }}{{ x|tojson(separators=(',',':')) }}{{ {\"b\":1,\"a\":2}|tojson(sort_keys=true) }}",
     "{\"a\": 1, \"items\": [1, 2], \"b\": null, \"s\": \" Hi There \"}\"\xc3\xa9""\\n\\\"\\\\\\u0001\"[\n  3,\n  1,\n  2\n]{\n  \"a\": 1,\n  \"items\": [\n    1,\n    2\n  ],\n  \"b\": null,\n  \"s\": \" Hi There \"\n}{}[]2.5nulltrue\"\\u00e9\"{\"a\":1,\"items\":[1,2],\"b\":null,\"s\":\" Hi There \"}{\"a\": 2, \"b\": 1}"},
    {"{{ '{\\n'|indent(4, first=true) }}|{{ \"a\\nb\\n\\nc\"|indent }}|{{ \"a\\nb\\n\\nc\"|indent(2, blank=true) }}|{{ \"a\\n\"|indent(2) }}|{{ \"\"|indent(2, true) }}|{{ \"x\\r\\ny\"|indent(\"--\") }}",
     "    {\n|a\n    b\n\n    c|a\n  b\n  \n  c|a\n|  |x\n--y"},
    {"{{ s|replace(\"b\", \"X\") }}{{ \"aaa\"|replace(\"a\", \"b\", 2) }}{{ \"ab\"|replace(\"\", \"-\") }}{{ s.replace(\" \", \"_\") }}{{ \"aaa\".replace(\"a\",\"b\",1) }}",
     "aX cbba-a-b-ab_cbaa"},
    {"{{ \"  x  \"|trim }}|{{ \"xxhixx\"|trim(\"x\") }}|{{ \"  x  \".strip() }}|{{ \"--x--\".lstrip(\"-\") }}|{{ \"--x--\".rstrip(\"-\") }}|{{ x.s.strip() }}|{{ \"\\u00a0x\\u3000\".strip() }}",
     "x|hi|x|x--|--x|Hi There|x"},
    {"{{ l|join(\",\") }}{{ ms|join(\", \", attribute=\"name\") }}{{ [1,none,\"a\"]|join }}{{ l|length }}{{ u|length }}{{ x|length }}{{ zz|length }}{{ l|count }}",
     "3,1,2b, a, C1Nonea311403"},
    {"{{ ms|selectattr(\"t\")|map(attribute=\"name\")|list }}{{ ms|rejectattr(\"t\")|map(attribute=\"name\")|list }}{{ ms|selectattr(\"t\", \"equalto\", \"x\")|list|length }}{{ l|select(\"odd\")|list }}{{ l|reject(\"odd\")|list }}{{ [0,1,none,\"\",2]|select|list }}{{ ms|selectattr(\"v\", \"gt\", 1)|map(attribute=\"name\")|join }}",
     "['b', 'C']['a']1[3, 1][2][1, 2]bC"},
    {"{{ ms|map(attribute=\"zz\", default=\"D\")|list }}{{ [\"a\",\"b\"]|map(\"upper\")|list }}{{ l|map(\"string\")|list }}{{ [1.5,2]|map(\"int\")|list }}",
     "['D', 'D', 'D']['A', 'B']['3', '1', '2'][1, 2]"},
    {"{{ zz }}|{{ zz|default(\"d\") }}|{{ \"\"|default(\"d\") }}|{{ \"\"|default(\"d\", true) }}|{{ none|default(\"d\") }}|{{ zz|d(5) }}{{ x.zz|default(1) }}",
     "|d||d|None|51"},
    {"{{ s|list }}{{ x|list }}{{ l|reverse|list }}{{ u|reverse }}{{ zz|list }}",
     "['a', 'b', ' ', 'c']['a', 'items', 'b', 's'][2, 1, 3]dlr\xc3\xb6""w oll\xc3\xa9""h[]"},
    {"{{ 1 if false }}|{{ 1 if true else 2 }}|{{ 'a' if zz is defined else 'b' }}|{{ none if true }}",
     "|1|b|None"},
    {"{{ \"a\" ~ 1 ~ none ~ zz ~ t ~ [1] }}{{ (\"x\"|safe) + \"<\" }}{{ \"<\" + (\"x\"|safe) }}{{ (\"x\"|safe) ~ \"<\" }}{{ \"<a>\"|e }}{{ \"<a>\"|escape|safe }}",
     "a1NoneTrue[1]x&lt;&lt;xx<&lt;a&gt;&lt;a&gt;"},
    {"{{ none == zz }}{{ zz == zz }}{{ not zz }}{{ zz and 1 }}|{{ 0 or 'x' }}{{ 1 and 2 }}{{ [] or {} }}",
     "FalseTrueTrue|x2{}"},
    {"{{ [1,2,3]|batch(2)|list }}{{ \"a b  c\"|wordcount }}{{ l|sum }}{{ l|min }}{{ l|max }}{{ ms|sum(attribute='v') }}{{ \"ab\"|center(6) }}|",
     "[[1, 2], [3]]36136  ab  |"},
    {"{{ range(3)|list }}{{ range(1,4)|list }}{{ range(5,0,-2)|list }}{{ range(0)|list }}",
     "[0, 1, 2][1, 2, 3][5, 3, 1][]"},
    {"{{ messages[0].content|upper }}{{ messages|length }}{{ messages[-1]['role'] }}",
     "HI1user"},
    {"{{ ms[0].name ~ ms[1]['name'] }}{{ ms|map(attribute='name')|first }}{{ ms|selectattr('name','in',['a','b'])|list|length }}",
     "bab2"},
    {"{{ \"x\"|string }}{{ 1|string }}{{ [1,\"a\"]|string }}{{ none|string }}{{ t|string }}{{ {'a':\"it's\"} }}{{ [\"a'b\\\"c\"] }}",
     "x1[1, 'a']NoneTrue{'a': \"it's\"}['a\\'b\"c']"},
    {"{{ s|upper|replace(\"A\",\"4\")|lower }}{{ l|map('string')|join('-')|upper }}{{ -3|abs }}{{ (-3)|abs }}",
     "4b c3-1-233"},
    {"{{ i|string|length }}{{ \"%s\" }}{{ 'a' 'b' }}",
     "1%sab"},
};

static const render_case loops_cases[] = {
    {"{% for a in [1,2,3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('a','b') }}|{% endfor %}",
     "1032TrueFalse32a|2121FalseFalse313b|3210FalseTrue32a|"},
    {"{% for k, v in x.items() %}{{ k }}={{ v }};{% endfor %}",
     "a=1;items=[1, 2];b=None;s= Hi There ;"},
    {"{% for k in x %}{{ k }},{% endfor %}{% for c in u %}[{{ c }}]{% endfor %}",
     "a,items,b,s,[h][\xc3\xa9""][l][l][o][ ][w][\xc3\xb6""][r][l][d]"},
    {"{% for a in l if a > 1 %}{{ loop.index }}:{{ a }}{{ loop.last }} {% else %}empty{% endfor %}{% for a in [] %}x{% else %}E{% endfor %}",
     "1:3False 2:2True E"},
    {"{% for a in l %}{% if a == 1 %}{% break %}{% endif %}{{ a }}{% endfor %}|{% for a in l %}{% if a == 1 %}{% continue %}{% endif %}{{ a }}{% endfor %}",
     "3|32"},
    {"{% set ns = namespace(a=1, b=[]) %}{% for i in range(3) %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}{{ ns.b }}",
     "4[]"},
    {"{% for m in messages %}{% set ns = 1 %}{% endfor %}{{ ns }}",
     ""},
};

static const render_case macros_cases[] = {
    {"{% macro m(a, b=2, c=none) %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}{{ m(1) }}|{{ m(1, 3) }}|{{ m(1, c=5) }}|{{ m(a=9) }}|{{ m() }}",
     "1-2-None|1-3-None|1-2-5|9-2-None|-2-None"},
    {"{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n-1) }}{% endif %}{% endmacro %}{{ f(5) }}",
     "54321"},
    {"{% set q = 5 %}{% macro g() %}{{ q }}{% endmacro %}{% set q = 6 %}{{ g() }}",
     "6"},
};

static const render_case expressions_cases[] = {
    /* escapes past U+10FFFF become U+FFFD, in valid UTF-8 */
    {"{{ \"\\U0001F600\\u00e9\\U00110000\\101\" }}", "\xF0\x9F\x98\x80\xC3\xA9\xEF\xBF\xBD" "A"},
    {"{{ 1e20 }} {{ 1.0e-5 }} {{ 0.1+0.2 }} {{ 10/2 }} {{ 1e16 }} {{ 123456789012345.6 }} {{ 0.0001 }} {{ -0.0 }} {{ 1/3 }}",
     "1e+20 1e-05 0.30000000000000004 5.0 1e+16 123456789012345.6 0.0001 -0.0 0.3333333333333333"},
    {"{{ 3 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 2 ** -1 }}",
     "1 -4 2 1024 3.5 3.0 0.5 0.5"},
    {"{{ \"abc\" * 2 }}{{ [1]*2 }}{{ 2 * \"x\" }}",
     "abcabc[1, 1]xx"},
    {"  {% if true %}\n  x\n  {% endif %}\n  y {% if true %}z{% endif %}",
     "  x\n  y z"},
    {"{{ \"a b\".split() }}{{ \"a,b,,c\".split(\",\") }}{{ \"abc\".split(\"b\", 1) }}{{ \"  a  b  c \".split(None, 1) }}{{ u.split(\"\xc3\xb6""\") }}",
     "['a', 'b']['a', 'b', '', 'c']['a', 'c']['a', 'b  c ']['h\xc3\xa9""llo w', 'rld']"},
    {"{{ 5 is divisibleby 3 }}{{ 6 is divisibleby(3) }}{{ \"x\" is lower }}{{ 3 is odd }}{{ 3 is even }}{{ none is none }}{{ x is mapping }}{{ l is sequence }}{{ s is iterable }}{{ i is number }}{{ f is float }}{{ i is integer }}{{ t is boolean }}{{ t is true }}{{ t is false }}{{ zz is defined }}{{ zz is undefined }}{{ 1 is eq 1 }}{{ 1 is equalto 2 }}{{ 1 is sameas 1 }}{{ 2 is gt 1 }}{{ 'a' is in 'abc' }}",
     "FalseTrueTrueTrueFalseTrueTrueTrueTrueTrueTrueTrueTrueTrueFalseFalseTrueTrueFalseTrueTrueTrue"},
    {"{{ x.get(\"a\") }}{{ x.get(\"q\", 5) }}{{ x.get(\"q\") }}{{ x.get(\"b\", 3) }}",
     "15NoneNone"},
    {"{{ s.startswith(\"ab\") }}{{ s.endswith(\"c\") }}{{ s.startswith((\"x\",\"a\")) }}{{ s.find(\"c\") }}{{ u.find(\"w\") }}{{ s.count(\"a\") }}{{ s.upper() }}{{ s.title() }}{{ \"{} and {}\".format(1, \"b\") }}{{ \"{0}{x}\".format(5, x=6) }}",
     "TrueTrueTrue361AB CAb C1 and b56"},
    {"{{ 'a' in 'abc' }}{{ 1 in l }}{{ 'a' in x }}{{ 9 not in l }}{{ 'z' in zz }}{{ not 1 in l }}{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 1 == 1.0 }}{{ 1 == true }}{{ [1,2] == [1,2] }}{{ 'a' < 'b' }}",
     "TrueTrueTrueTrueFalseFalseTrueFalseTrueTrueTrueTrue"},
    {"{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = 1, 2 %}{{ c }}",
     "12(1, 2)"},
    {"{#- c -#}  a  {#- c #}\nb {# c #}\n  {# x #}\nz",
     "ab z"},
    {"{%- for m in messages -%}\n  {{- m.role -}}\n{%- endfor %}\n  X  ",
     "user  X  "},
    {"a\n{%+ if true %}b{% endif +%}\nc",
     "a\nb\nc"},
    {"{% raw %}{{ x }}{% endraw %}y",
     "{{ x }}y"},
    {"{%- if x is defined and x.a == 1 -%}\nyes\n{%- elif x.a == 2 -%}\nno\n{%- else -%}\nmaybe\n{%- endif %}\n",
     "yes"},
    {"{{ -i }}{{ +f }}{{ -(1) - -1 }}{{ not t }}{{ 2 + 3 * 4 }}{{ (2 + 3) * 4 }}{{ 2 ** 3 ** 2 }}{{ -2 ** 2 }}{{ 10 - 2 - 3 }}{{ 1 ~ (2 + 3) }}",
     "-72.50False1420644515"},
};

static const render_case whitespace_cases[] = {
    {"a  {%- if true -%}  b  {%- endif -%}  c",
     "abc"},
    {"a\n  {% if true %}\n  b\n  {% endif %}\nc",
     "a\n  b\nc"},
    {"  {{ \"x\" }}\n  {% set y = 1 %}\nend",
     "  x\nend"},
    {"x {% if true %} y {% endif %} z",
     "x  y  z"},
    {"line1\n    {#- comment #}\nline2",
     "line1line2"},
    {"{% for i in range(2) %}\n  item{{ i }}\n{% endfor %}",
     "  item0\n  item1\n"},
    {"{%- for i in range(3) -%}\n{{ i }}\n{%- endfor -%}",
     "012"},
    {"a{{- \"b\" -}}  c {{ \"d\" }}\ne",
     "abc d\ne"},
    {"\t{% if true %}tab{% endif %}",
     "tab"},
    {"a {%+ if true %}b{% endif %}",
     "a b"},
    {"{% if true %}\nx\n{% endif +%}\ny",
     "x\n\ny"},
    {"text\ntrailing newline\n",
     "text\ntrailing newline"},
    {"{{ \"{{ not a tag }}\" }}{{ '%}' }}{{ {'a': {'b': 1}} }}",
     "{{ not a tag }}%}{'a': {'b': 1}}"},
    {"{% if true %}a{% else %}b{% endif %}{% if false %}a{% elif true %}c{% else %}b{% endif %}{% if false %}a{% elif false %}c{% endif %}\n",
     "ac"},
};

static const char *const tools_ctx = "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"weather in Paris?\"}, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"call_1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"units\": [\"c\", 1, 2.5, true, null]}}}]}, {\"role\": \"tool\", \"tool_call_id\": \"call_1\", \"name\": \"get_weather\", \"content\": \"{\\\"temp\\\": 20}\"}, {\"role\": \"assistant\", \"content\": \"It is 20C.\"}, {\"role\": \"user\", \"content\": \"thanks\"}], \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get weather <b>\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"City\"}, \"units\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"]}, \"days\": {\"type\": \"integer\"}, \"opts\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}}, \"required\": [\"city\"]}}}]}";

static const struct { const char *file, *expected; } tools_cases[] = {
    {"Qwen-Qwen2.5-7B-Instruct.jinja",
    "<|im_start|>system\n"
    "sys\n"
    "\n"
    "# Tools\n"
    "\n"
    "You may call one or more functions to assist with the user query.\n"
    "\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n"
    "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get weather <b>\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"City\"}, \"units\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"]}, \"days\": {\"type\": \"integer\"}, \"opts\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}}, \"required\": [\"city\"]}}}\n"
    "</tools>\n"
    "\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n"
    "weather in Paris?<|im_end|>\n"
    "<|im_start|>assistant\n"
    "<tool_call>\n"
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"units\": [\"c\", 1, 2.5, true, null]}}\n"
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n"
    "<tool_response>\n"
    "{\"temp\": 20}\n"
    "</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n"
    "It is 20C.<|im_end|>\n"
    "<|im_start|>user\n"
    "thanks<|im_end|>\n"
    "<|im_start|>assistant\n"
    ""},
    {"meta-llama-Llama-3.1-8B-Instruct.jinja",
    "<s><|start_header_id|>system<|end_header_id|>\n"
    "\n"
    "Environment: ipython\n"
    "Cutting Knowledge Date: December 2023\n"
    "Today Date: 26 Jul 2024\n"
    "\n"
    "sys<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
    "\n"
    "Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n"
    "\n"
    "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not use variables.\n"
    "\n"
    "{\n"
    "    \"type\": \"function\",\n"
    "    \"function\": {\n"
    "        \"name\": \"get_weather\",\n"
    "        \"description\": \"Get weather <b>\",\n"
    "        \"parameters\": {\n"
    "            \"type\": \"object\",\n"
    "            \"properties\": {\n"
    "                \"city\": {\n"
    "                    \"type\": \"string\",\n"
    "                    \"description\": \"City\"\n"
    "                },\n"
    "                \"units\": {\n"
    "                    \"type\": \"string\",\n"
    "                    \"enum\": [\n"
    "                        \"c\",\n"
    "                        \"f\"\n"
    "                    ]\n"
    "                },\n"
    "                \"days\": {\n"
    "                    \"type\": \"integer\"\n"
    "                },\n"
    "                \"opts\": {\n"
    "                    \"type\": \"array\",\n"
    "                    \"items\": {\n"
    "                        \"type\": \"string\"\n"
    "                    }\n"
    "                }\n"
    "            },\n"
    "            \"required\": [\n"
    "                \"city\"\n"
    "            ]\n"
    "        }\n"
    "    }\n"
    "}\n"
    "\n"
    "weather in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
    "\n"
    "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"units\": [\"c\", 1, 2.5, true, null]}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n"
    "\n"
    "\"{\\\"temp\\\": 20}\"<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
    "\n"
    "It is 20C.<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
    "\n"
    "thanks<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
    "\n"
    ""},
    {"google-gemma-4-31B-it.jinja",
    "<s><|turn>system\n"
    "sys<|tool>declaration:get_weather{description:<|\"|>Get weather <b><|\"|>,parameters:{properties:{city:{description:<|\"|>City<|\"|>,type:<|\"|>STRING<|\"|>},days:{type:<|\"|>INTEGER<|\"|>},opts:{items:{type:<|\"|>STRING<|\"|>},type:<|\"|>ARRAY<|\"|>},units:{enum:[<|\"|>c<|\"|>,<|\"|>f<|\"|>],type:<|\"|>STRING<|\"|>}},required:[<|\"|>city<|\"|>],type:<|\"|>OBJECT<|\"|>}}<tool|><turn|>\n"
    "<|turn>user\n"
    "weather in Paris?<turn|>\n"
    "<|turn>model\n"
    "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,units:[<|\"|>c<|\"|>,1,2.5,true,None]}<tool_call|><|tool_response>response:get_weather{value:<|\"|>{\"temp\": 20}<|\"|>}<tool_response|>It is 20C.<turn|>\n"
    "<|turn>user\n"
    "thanks<turn|>\n"
    "<|turn>model\n"
    "<|channel>thought\n"
    "<channel|>"},
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

TEST(tmpl_filters_match_jinja) { run_cases(filters_cases, COUNT(filters_cases), unit_ctx); }
TEST(tmpl_loops_match_jinja) { run_cases(loops_cases, COUNT(loops_cases), unit_ctx); }
TEST(tmpl_macros_match_jinja) { run_cases(macros_cases, COUNT(macros_cases), unit_ctx); }
TEST(tmpl_expressions_match_jinja) { run_cases(expressions_cases, COUNT(expressions_cases), unit_ctx); }
TEST(tmpl_whitespace_control_matches_jinja) {
    run_cases(whitespace_cases, COUNT(whitespace_cases), unit_ctx);
}

TEST(tmpl_scoping_and_namespaces) {
    /* a set inside a loop does not leak out, nor survive to the next iteration */
    CHECK_RENDERS("{% set v = 1 %}{% for i in [1,2] %}{{ v }}{% set v = 5 %}{{ v }}{% endfor %}{{ v }}",
                  NULL, "15151");
    /* ...but a namespace attribute does */
    CHECK_RENDERS("{% set ns = namespace(c=0) %}{% for i in range(4) %}{% set ns.c = ns.c + i %}"
                  "{% endfor %}{{ ns.c }}", NULL, "6");
    /* a set inside an if is visible after it */
    CHECK_RENDERS("{% if true %}{% set v = 2 %}{% endif %}{{ v }}", NULL, "2");
    /* macros see their own args and the top level, not the caller's loop variables */
    CHECK_RENDERS("{% macro m() %}[{{ i }}]{% endmacro %}{% for i in [1] %}{{ m() }}{% endfor %}",
                  NULL, "[]");
    CHECK_RENDERS("{% set ns = namespace(items=[]) %}{% set _ = ns.items.append(1) %}{{ ns.items }}",
                  NULL, "[1]");
    CHECK_FAILS("{% set v = 1 %}{% set v.a = 2 %}", NULL, HL_ERR_FORMAT, "namespace");
    CHECK_RENDERS("{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }},{% endfor %}", NULL, "3,7,");
    CHECK_FAILS("{% for a, b in [[1, 2, 3]] %}{% endfor %}", NULL, HL_ERR_FORMAT, "too many values");
    CHECK_RENDERS("{% filter upper %}ab{{ 'c' }}{% endfilter %}", NULL, "ABC");
    CHECK_RENDERS("{% generation %}x{% endgeneration %}", NULL, "x");
}

TEST(tmpl_undefined_semantics) {
    CHECK_RENDERS("[{{ nope }}][{{ nope|length }}][{{ nope ~ 'a' }}][{{ nope|default('d') }}]"
                  "[{{ nope is defined }}][{% for x in nope %}x{% endfor %}][{{ not nope }}]",
                  NULL, "[][0][a][d][False][][True]");
    CHECK_RENDERS("{{ m.missing }}|{{ m['missing'] }}|{{ m.missing is defined }}",
                  "{\"m\": {\"a\": 1}}", "||False");
    /* only using an undefined value in a way jinja forbids is an error */
    CHECK_FAILS("{{ nope.attr }}", NULL, HL_ERR_FORMAT, "'nope' is undefined");
    CHECK_FAILS("{{ m.missing.x }}", "{\"m\": {}}", HL_ERR_FORMAT,
                "'dict object' has no attribute 'missing'");
    CHECK_FAILS("{{ nope() }}", NULL, HL_ERR_FORMAT, "'nope' is undefined");
    CHECK_FAILS("{{ nope + 1 }}", NULL, HL_ERR_FORMAT, "'nope' is undefined");
    CHECK_FAILS("{{ nope|tojson }}", NULL, HL_ERR_FORMAT, "'nope' is undefined");
    CHECK_FAILS("{{ [1][3] + 1 }}", NULL, HL_ERR_FORMAT, "list object has no element 3");
    CHECK_FAILS("{{ strftime_now('%Y') }}", NULL, HL_ERR_FORMAT, "'strftime_now' is undefined");
}

TEST(tmpl_syntax_errors_have_positions) {
    static const struct { const char *src, *want; } cases[] = {
        {"{% if true %}x", "line 1, column 14: unexpected end of template: the 'if' block"},
        {"a\n{% for x in y %}", "the 'for' block opened at line 2 was never closed"},
        {"{{ x", "line 1, column 5: unexpected end of template, expected '}}'"},
        {"{{ x }", "unexpected '}'"},
        {"\n\n  {% endif %}", "line 3, column 6: unexpected 'endif'"},
        {"{% foo %}", "unknown tag 'foo'"},
        {"{# open", "missing end of comment tag"},
        {"{{ 'abc }}", "unterminated string literal"},
        {"{{ 1 + }}", "expected an expression, got '}}'"},
        {"{% set %}", "expected a variable name"},
        {"{% macro %}{% endmacro %}", "expected macro name"},
        {"{% if x %}{% else %}{% else %}{% endif %}", "unexpected 'else'"},
        {"{{ }}", "expected an expression"},
        {"{% if true %}{% endfor %}", "unexpected 'endfor' (expected 'endif')"},
        {"{{ 99999999999999999999 }}", "integer literal too large"},
        {"{{ a ? b }}", "unexpected character '?'"},
        {"{% for x in y recursive %}{% endfor %}", "recursive loops are not supported"},
        {"{% raw %}never closed", "missing endraw"},
        {"{% macro m(a=1, b) %}{% endmacro %}", "non-default parameter"},
    };
    for (size_t i = 0; i < COUNT(cases); i++) {
        tmpl *t = NULL;
        hl_err err;
        hl_status st = tmpl_compile(cases[i].src, strlen(cases[i].src), &t, &err);
        CHECK_MSG(st == HL_ERR_FORMAT, "case %zu (%s) compiled (status %d)", i, cases[i].src, st);
        CHECK(t == NULL);
        CHECK_MSG(strstr(err.msg, "template syntax error at line") != NULL, "%s", err.msg);
        CHECK_MSG(strstr(err.msg, cases[i].want) != NULL, "case %zu: \"%s\" lacks \"%s\"", i,
                  err.msg, cases[i].want);
    }
}

TEST(tmpl_runtime_errors_have_lines) {
    CHECK_RENDERS("{{ x.a.b }}", "{\"x\": {\"a\": 1}}", ""); /* undefined, printed empty */
    CHECK_FAILS("a\nb\n{{ x.a.b.c }}", "{\"x\": {\"a\": 1}}", HL_ERR_FORMAT,
                "template error at line 3: 'int object' has no attribute 'b'");
    CHECK_FAILS("{% for a in 5 %}{% endfor %}", NULL, HL_ERR_FORMAT, "'int' object is not iterable");
    CHECK_FAILS("{{ 1 / 0 }}", NULL, HL_ERR_FORMAT, "division by zero");
    CHECK_FAILS("{{ 1 < 'a' }}", NULL, HL_ERR_FORMAT, "'<' not supported between instances of 'int' and 'str'");
    CHECK_FAILS("{{ 'a' + 1 }}", NULL, HL_ERR_FORMAT, "can only concatenate str");
    CHECK_FAILS("{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}", NULL, HL_ERR_FORMAT,
                "macro 'f' takes not more than 1 argument(s)");
    CHECK_FAILS("{% macro f(a) %}{% endmacro %}{{ f(b=2) }}", NULL, HL_ERR_FORMAT,
                "macro 'f' takes no keyword argument 'b'");
    CHECK_FAILS("{{ 'x'.nosuch() }}", NULL, HL_ERR_FORMAT, "has no attribute 'nosuch'");
    CHECK_FAILS("{{ 9223372036854775807 + 1 }}", NULL, HL_ERR_FORMAT, "integer overflow");
    CHECK_FAILS("{{ {'a': 1}.update({}) }}", NULL, HL_ERR_FORMAT, "unsafe");
    CHECK_FAILS("{{ 5|length }}", NULL, HL_ERR_FORMAT, "object of type 'int' has no len()");
    CHECK_FAILS("{{ (1, 2).append(3) }}", NULL, HL_ERR_FORMAT, "'tuple' object has no attribute");
    /* unknown filters and tests fail when used, not at compile time (see internal.h) */
    CHECK_FAILS("{{ x | nosuch }}", NULL, HL_ERR_FORMAT, "line 1: no filter named 'nosuch'");
    CHECK_FAILS("{{ x is nosuch }}", NULL, HL_ERR_FORMAT, "no test named 'nosuch'");
    CHECK_RENDERS("{% if false %}{{ x | nosuch }}{{ x is nosuch }}{% endif %}ok", NULL, "ok");
    CHECK_FAILS("{{ [1]|items }}", NULL, HL_ERR_FORMAT, "Can only get item pairs from a mapping.");
    CHECK_FAILS("{{ 'a'|trim(1, 2) }}", NULL, HL_ERR_FORMAT, "takes at most 1 argument");
}

TEST(tmpl_raise_exception_message) {
    CHECK_FAILS("{% if messages[0].role == 'system' %}{{ raise_exception('System role not "
                "supported') }}{% endif %}",
                "{\"messages\": [{\"role\": \"system\", \"content\": \"x\"}]}", HL_ERR_INVALID,
                "System role not supported");
    char *out;
    hl_err err;
    CHECK(render_text("{{ raise_exception('boom ' ~ 42) }}", NULL, NULL, &out, &err) ==
          HL_ERR_INVALID);
    CHECK_STR(err.msg, "boom 42");
}

TEST(tmpl_hostile_templates_fail_cleanly) {
    tmpl_limits lim = tmpl_default_limits();
    lim.max_memory = 32u << 20;
    char *out;
    hl_err err;
    static const struct { const char *src, *want; } cases[] = {
        {"{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "macro calls nested deeper than 200"},
        {"{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nested deeper"},
        {"{% set inner = range(1000) %}{% for i in range(100000) %}{% for j in inner %}{% endfor %}"
         "{% endfor %}",
         "loop iterations"},
        {"{{ range(1000000)|length }}", "Range too big"},
        {"{{ 'ab' * 100000000000 }}", "too large"},
        {"{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(60) %}"
         "{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "memory"},
        {"{% for i in range(100000) %}{{ 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa' * 1000 }}"
         "{% endfor %}", "output exceeds"},
        {"{% set s = 'a' * 1000000 %}{% for i in range(100000) %}{% if 'b' in s %}{% endif %}"
         "{% endfor %}", "evaluation steps"},
        {"{{ x.y }}", "'x' is undefined"},
    };
    lim.max_output = 1u << 20;
    for (size_t i = 0; i < COUNT(cases); i++) {
        hl_status st = render_text(cases[i].src, NULL, &lim, &out, &err);
        if (st == HL_OK) free(out);
        CHECK_MSG(st != HL_OK, "case %zu rendered", i);
        CHECK_MSG(strstr(err.msg, cases[i].want) != NULL, "case %zu: \"%s\" lacks \"%s\"", i,
                  err.msg, cases[i].want);
    }
}

/* Deeply nested source must be a parse error, not a stack overflow. */
TEST(tmpl_deep_nesting_is_an_error) {
    size_t depth = 50000;
    char *src = malloc(depth * 2 + 16);
    CHECK(src);
    size_t k = 0;
    k += (size_t)sprintf(src + k, "{{ ");
    for (size_t i = 0; i < depth; i++) src[k++] = '(';
    src[k++] = '1';
    for (size_t i = 0; i < depth; i++) src[k++] = ')';
    k += (size_t)sprintf(src + k, " }}");
    tmpl *t;
    hl_err err;
    hl_status st = tmpl_compile(src, k, &t, &err);
    CHECK(st == HL_ERR_FORMAT);
    CHECK(strstr(err.msg, "nested too deeply") != NULL);
    /* nested blocks and `not not not ...` and long unary chains */
    size_t blk = 0;
    char *src2 = malloc(depth * 16 + 16);
    CHECK(src2);
    for (size_t i = 0; i < 5000; i++) blk += (size_t)sprintf(src2 + blk, "{%% if 1 %%}");
    st = tmpl_compile(src2, blk, &t, &err);
    CHECK(st == HL_ERR_FORMAT);
    blk = (size_t)sprintf(src2, "{{ ");
    for (size_t i = 0; i < 20000; i++) blk += (size_t)sprintf(src2 + blk, "not ");
    for (size_t i = 0; i < 20000; i++) blk += (size_t)sprintf(src2 + blk, "-");
    blk += (size_t)sprintf(src2 + blk, "1 }}");
    st = tmpl_compile(src2, blk, &t, &err);
    CHECK(st == HL_ERR_FORMAT);
    /* long flat chains (a + a + ..., a|f|f..., a.b.c...) nest the evaluator just as deeply */
    static const char *const links[] = {" + 1", "|string", ".a", " and 1", " ~ 'x'"};
    for (size_t l = 0; l < COUNT(links); l++) {
        blk = (size_t)sprintf(src2, "{{ 1");
        for (size_t i = 0; i < 20000; i++) blk += (size_t)sprintf(src2 + blk, "%s", links[l]);
        blk += (size_t)sprintf(src2 + blk, " }}");
        st = tmpl_compile(src2, blk, &t, &err);
        CHECK_MSG(st == HL_ERR_FORMAT && strstr(err.msg, "nested too deeply"), "%s: %s", links[l],
                  st ? err.msg : "compiled");
    }
    /* recursion through macros with deep expressions stops at the evaluation depth limit */
    blk = (size_t)sprintf(src2, "{%% macro f(n) %%}{{ ");
    for (size_t i = 0; i < 40; i++) blk += (size_t)sprintf(src2 + blk, "(");
    blk += (size_t)sprintf(src2 + blk, "f(n + 1)");
    for (size_t i = 0; i < 40; i++) blk += (size_t)sprintf(src2 + blk, ")|string");
    blk += (size_t)sprintf(src2 + blk, " }}{%% endmacro %%}{{ f(0) }}");
    CHECK_OK(tmpl_compile(src2, blk, &t, &err), &err);
    char *out;
    size_t n;
    st = tmpl_render(t, NULL, &out, &n, &err);
    tmpl_destroy(t);
    CHECK(st == HL_ERR_INVALID);
    CHECK_MSG(strstr(err.msg, "nested too deeply") != NULL, "%s", err.msg);
    free(src);
    free(src2);
}

/* Random token soup: must compile or fail cleanly, and render or fail cleanly. */
TEST(tmpl_random_templates_do_not_crash) {
    static const char *const parts[] = {"{{", "}}", "{%", "%}", "{#", "#}", "-", "+", " if ",
        " for ", " in ", " endif ", " endfor ", " set ", "=", "x", "y", "(", ")", "[", "]", "{",
        "}", "'s'", "\"", "1", "2.5", "|", "trim", "length", "is", "defined", " not ", " and ",
        ".", ",", ":", "~", "*", "/", "macro", "endmacro", "m", "namespace", "ns", "\n", " ",
        "loop", "range", "messages", "else", "elif", "break", "tojson", "raw", "endraw", "\\",
        "items()", "%", "**", "//", "<", "==", "default", "call"};
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    json_t *ctx = json_loads("{\"x\": [1, {\"a\": \"b\"}], \"y\": \"str\", \"messages\": []}", 0, NULL);
    CHECK(ctx);
    int compiled = 0;
    for (int iter = 0; iter < 3000; iter++) {
        char src[512];
        size_t k = 0;
        int n = 1 + (int)(seed % 24);
        for (int i = 0; i < n; i++) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            const char *p = parts[seed % COUNT(parts)];
            size_t l = strlen(p);
            if (k + l >= sizeof src) break;
            memcpy(src + k, p, l);
            k += l;
        }
        tmpl *t;
        hl_err err;
        if (tmpl_compile(src, k, &t, &err) != HL_OK) {
            CHECK(err.msg[0] != 0);
            continue;
        }
        compiled++;
        char *out;
        size_t len;
        if (tmpl_render(t, ctx, &out, &len, &err) == HL_OK) free(out);
        tmpl_destroy(t);
    }
    json_decref(ctx);
    CHECK(compiled > 50);
}

TEST(tmpl_context_edge_cases) {
    char *out;
    hl_err err;
    /* NULL context */
    CHECK_OK(render_text("a{{ b }}c", NULL, NULL, &out, &err), &err);
    CHECK_STR(out, "ac");
    free(out);
    /* a non-object context is refused */
    tmpl *t;
    CHECK_OK(tmpl_compile("x", 1, &t, &err), &err);
    json_t *arr = json_array();
    size_t n;
    CHECK(tmpl_render(t, arr, &out, &n, &err) == HL_ERR_INVALID);
    json_decref(arr);
    /* one compiled template renders many times, with different contexts */
    tmpl_destroy(t);
    CHECK_OK(tmpl_compile("{{ v }}", 7, &t, &err), &err);
    for (int i = 0; i < 3; i++) {
        json_t *ctx = json_pack("{s:i}", "v", i);
        CHECK_OK(tmpl_render(t, ctx, &out, &n, &err), &err);
        CHECK_EQ_INT(out[0], '0' + i);
        CHECK_EQ_INT(n, 1);
        free(out);
        json_decref(ctx);
    }
    tmpl_destroy(t);
    tmpl_destroy(NULL);
    /* JSON types map to Python's: ints stay ints, reals print like Python floats */
    CHECK_RENDERS("{{ a }} {{ b }} {{ c }} {{ d }} {{ e }} {{ a is integer }} {{ b is float }}",
                  "{\"a\": 3, \"b\": 3.0, \"c\": null, \"d\": true, \"e\": [1.5, \"x\"]}",
                  "3 3.0 None True [1.5, 'x'] True True");
    /* a template of CRLF lines renders with LF, and a final newline is dropped */
    CHECK_RENDERS("a\r\nb\r\n", NULL, "a\nb");
    CHECK_RENDERS("", NULL, "");
}

TEST(tmpl_tokenizer_config_template) {
    json_t *cfg = json_loads("{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"},"
                             " {\"name\": \"default\", \"template\": \"D\"}]}", 0, NULL);
    CHECK(cfg);
    CHECK_STR(tmpl_from_tokenizer_config(cfg), "D");
    json_decref(cfg);
    cfg = json_loads("{\"chat_template\": \"S\"}", 0, NULL);
    CHECK_STR(tmpl_from_tokenizer_config(cfg), "S");
    json_decref(cfg);
    cfg = json_loads("{\"other\": 1}", 0, NULL);
    CHECK(tmpl_from_tokenizer_config(cfg) == NULL);
    json_decref(cfg);
}

static char *load_template(const char *rel, hl_err *err) {
    const char *path = test_shared_path(rel);
    if (!path) return NULL;
    char *buf;
    size_t len;
    if (hl_file_read(path, &buf, &len, err)) return NULL;
    size_t rl = strlen(rel);
    if (rl > 5 && strcmp(rel + rl - 5, ".json") == 0) {
        json_error_t je;
        /* some configs hold integers beyond int64, which jansson refuses as integers */
        json_t *cfg = json_loadb(buf, len, JSON_DECODE_INT_AS_REAL, &je);
        free(buf);
        if (!cfg) return NULL;
        const char *t = tmpl_from_tokenizer_config(cfg);
        char *copy = t ? strdup(t) : NULL;
        json_decref(cfg);
        return copy;
    }
    return buf;
}

TEST(tmpl_rendered_jsonl_matches_python) {
    const char *path = test_shared_path("testdata/chat_templates/rendered.jsonl");
    if (!path) SKIP("testdata/chat_templates/rendered.jsonl not found");
    char *data;
    size_t len;
    hl_err err;
    CHECK_OK(hl_file_read(path, &data, &len, &err), &err);
    int records = 0, errors = 0;
    char *line = data;
    while (line && *line) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        json_error_t je;
        json_t *rec = json_loads(line, 0, &je);
        CHECK_MSG(rec, "bad record %d: %s", records, je.text);
        records++;
        const char *tpath = json_string_value(json_object_get(rec, "template"));
        char *src = load_template(tpath, &err);
        CHECK_MSG(src, "template %s not loadable", tpath);
        json_t *ctx = json_object();
        json_object_set(ctx, "messages", json_object_get(rec, "messages"));
        json_object_set(ctx, "add_generation_prompt", json_object_get(rec, "add_generation_prompt"));
        json_object_set(ctx, "bos_token", json_object_get(rec, "bos_token"));
        json_object_set(ctx, "eos_token", json_object_get(rec, "eos_token"));
        tmpl *t;
        hl_status st = tmpl_compile(src, strlen(src), &t, &err);
        free(src);
        CHECK_MSG(st == HL_OK, "%s: %s", tpath, err.msg);
        char *out = NULL;
        size_t n;
        st = tmpl_render(t, ctx, &out, &n, &err);
        tmpl_destroy(t);
        const char *expected = json_string_value(json_object_get(rec, "expected"));
        const char *error = json_string_value(json_object_get(rec, "error"));
        const char *conv = json_string_value(json_object_get(rec, "conversation"));
        if (expected) {
            CHECK_MSG(st == HL_OK, "%s %s: %s", tpath, conv, err.msg);
            CHECK_MSG(n == strlen(expected) && memcmp(out, expected, n) == 0,
                      "%s %s:\n  got      \"%s\"\n  expected \"%s\"", tpath, conv, out, expected);
        } else {
            CHECK_MSG(error, "record %d has neither expected nor error", records);
            errors++;
            CHECK_MSG(st == HL_ERR_INVALID, "%s %s: status %d, want a template error", tpath, conv, st);
            const char *msg = strstr(error, ": ") ? strstr(error, ": ") + 2 : error;
            CHECK_MSG(strstr(err.msg, msg) != NULL, "\"%s\" lacks \"%s\"", err.msg, msg);
        }
        free(out);
        json_decref(ctx);
        json_decref(rec);
        line = nl ? nl + 1 : NULL;
    }
    free(data);
    CHECK_EQ_INT(records, 66);
    CHECK_EQ_INT(errors, 2);
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

TEST(tmpl_all_real_templates_render_a_conversation) {
    const char *dir = test_shared_path("testdata/chat_templates/llama.cpp-templates");
    if (!dir) SKIP("testdata/chat_templates/llama.cpp-templates not found");
    DIR *d = opendir(dir);
    CHECK(d);
    char *names[128];
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d)) && count < 128) {
        size_t l = strlen(e->d_name);
        if (l > 6 && strcmp(e->d_name + l - 6, ".jinja") == 0) names[count++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)count, sizeof names[0], cmp_names);
    CHECK_EQ_INT(count, 57); /* SOURCES.md says 58: it counts the folder's README.md */
    /* The templates that legitimately raise for a plain system/user/assistant chat. */
    static const struct { const char *file, *error; } raising[] = {
        {"Mistral-Small-3.2-24B-Instruct-2506.jinja", "'strftime_now' is undefined"},
        {"openai-gpt-oss-120b.jinja", "'strftime_now' is undefined"},
        {"upstage-Solar-Open-100B.jinja", "'strftime_now' is undefined"},
        {"fireworks-ai-llama-3-firefunction-v2.jinja", "'functions' is undefined"},
        {"google-gemma-2-2b-it.jinja", "System role not supported"},
    };
    json_t *ctx = json_loads(
        "{\"messages\": [{\"role\": \"system\", \"content\": \"You are helpful.\"},"
        " {\"role\": \"user\", \"content\": \"Hello\"},"
        " {\"role\": \"assistant\", \"content\": \"Hi there\"},"
        " {\"role\": \"user\", \"content\": \"How are you?\"}],"
        " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}", 0, NULL);
    CHECK(ctx);
    int ok = 0, raised = 0;
    for (int i = 0; i < count; i++) {
        char rel[512];
        snprintf(rel, sizeof rel, "testdata/chat_templates/llama.cpp-templates/%s", names[i]);
        hl_err err;
        char *src = load_template(rel, &err);
        CHECK_MSG(src, "cannot read %s", names[i]);
        tmpl *t;
        hl_status st = tmpl_compile(src, strlen(src), &t, &err);
        free(src);
        CHECK_MSG(st == HL_OK, "%s does not compile: %s", names[i], err.msg);
        char *out = NULL;
        size_t n;
        st = tmpl_render(t, ctx, &out, &n, &err);
        tmpl_destroy(t);
        const char *want_error = NULL;
        for (size_t k = 0; k < COUNT(raising); k++)
            if (!strcmp(raising[k].file, names[i])) want_error = raising[k].error;
        if (want_error) {
            CHECK_MSG(st != HL_OK && strstr(err.msg, want_error), "%s: want error \"%s\", got %s",
                      names[i], want_error, st ? err.msg : "success");
            raised++;
            if (strstr(want_error, "strftime_now")) {
                /* with strftime_now defined (as newer transformers do) they render */
                tmpl_options o = tmpl_default_options();
                o.strftime_now = true;
                src = load_template(rel, &err);
                CHECK(src);
                CHECK_OK(tmpl_compile(src, strlen(src), &t, &err), &err);
                free(src);
                st = tmpl_render_opts(t, ctx, &o, &out, &n, &err);
                tmpl_destroy(t);
                CHECK_MSG(st == HL_OK, "%s with strftime_now: %s", names[i], err.msg);
                CHECK(strstr(out, "How are you?") != NULL);
            }
        } else {
            CHECK_MSG(st == HL_OK, "%s: %s", names[i], err.msg);
            CHECK_MSG(strstr(out, "Hello") && strstr(out, "Hi there") && strstr(out, "How are you?"),
                      "%s lost a message: %s", names[i], out);
            ok++;
        }
        free(out);
        free(names[i]);
    }
    json_decref(ctx);
    CHECK_EQ_INT(ok, 52);
    CHECK_EQ_INT(raised, 5);
}

TEST(tmpl_tool_calling_conversations_match_python) {
    for (size_t i = 0; i < COUNT(tools_cases); i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "testdata/chat_templates/llama.cpp-templates/%s", tools_cases[i].file);
        hl_err err;
        char *src = load_template(rel, &err);
        if (!src) SKIP("chat templates not found");
        char *out;
        hl_status st = render_text(src, tools_ctx, NULL, &out, &err);
        free(src);
        CHECK_MSG(st == HL_OK, "%s: %s", tools_cases[i].file, err.msg);
        CHECK_MSG(strcmp(out, tools_cases[i].expected) == 0, "%s:\n got \"%s\"\n want \"%s\"",
                  tools_cases[i].file, out, tools_cases[i].expected);
        free(out);
    }
}

TEST(tmpl_strftime_now_option) {
    const char *src = "{% if strftime_now is defined %}{{ strftime_now('%d %b %Y') }}{% else %}none"
                      "{% endif %}";
    tmpl *t;
    hl_err err;
    CHECK_OK(tmpl_compile(src, strlen(src), &t, &err), &err);
    char *out;
    size_t n;
    CHECK_OK(tmpl_render(t, NULL, &out, &n, &err), &err);
    CHECK_STR(out, "none");
    free(out);
    tmpl_options o = tmpl_default_options();
    o.strftime_now = true;
    o.now = 1721995200; /* 2024-07-26 12:00 UTC: the same date in every time zone but +-12h */
    CHECK_OK(tmpl_render_opts(t, NULL, &o, &out, &n, &err), &err);
    CHECK_STR(out, "26 Jul 2024");
    free(out);
    tmpl_destroy(t);
}

TEST(tmpl_percent_formatting) {
    CHECK_RENDERS("{{ \"%s-%d\" % (\"a\", 3) }}|{{ \"%05.2f\" % 3.14159 }}|{{ \"%r\" % \"x\" }}|"
                  "{{ \"%(a)s!\" % {\"a\": 1} }}|{{ \"%-4s|\" % \"ab\" }}|{{ \"%x\" % 255 }}|"
                  "{{ \"100%%\" % () }}|{{ \"%s\" % [1, 2] }}|{{ \"%3d\" % 7 }}|{{ \"%i\" % 2.7 }}",
                  NULL, "a-3|03.14|'x'|1!|ab  ||ff|100%|[1, 2]|  7|2");
    CHECK_FAILS("{{ '%s %s' % (1,) }}", NULL, HL_ERR_FORMAT, "not enough arguments");
    CHECK_FAILS("{{ '%s' % (1, 2) }}", NULL, HL_ERR_FORMAT, "not all arguments converted");
    CHECK_FAILS("{{ '%d' % 'x' }}", NULL, HL_ERR_FORMAT, "a number is required");
    CHECK_FAILS("{{ '%999999s' % 'x' }}", NULL, HL_ERR_INVALID, "too large");
}

TEST(tmpl_number_tests_on_floats) {
    CHECK_RENDERS("{{ 3.0 is odd }}{{ 3.5 is odd }}{{ 4.0 is even }}{{ 9 is divisibleby 1.5 }}"
                  "{{ -3 is odd }}{{ nope is callable }}", NULL, "TrueFalseTrueTrueTrueTrue");
}

typedef struct render_job {
    const tmpl *t;
    const json_t *ctx;
    const char *expected;
    int ok;
} render_job;

static void *render_thread(void *arg) {
    render_job *j = arg;
    for (int i = 0; i < 50; i++) {
        char *out;
        size_t n;
        hl_err err;
        if (tmpl_render(j->t, j->ctx, &out, &n, &err) != HL_OK) return NULL;
        if (strcmp(out, j->expected) == 0) j->ok++;
        free(out);
    }
    return NULL;
}

/* A compiled template is immutable: concurrent renders agree with a serial one. */
TEST(tmpl_concurrent_renders_share_a_template) {
    const char *src = "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
                      "<{{ m.role }}>{{ m.content|trim }}{% endfor %}{{ ns.n }}";
    tmpl *t;
    hl_err err;
    CHECK_OK(tmpl_compile(src, strlen(src), &t, &err), &err);
    json_t *ctx = json_loads("{\"messages\": [{\"role\": \"user\", \"content\": \" a \"},"
                             " {\"role\": \"assistant\", \"content\": \"b\"}]}", 0, NULL);
    CHECK(ctx);
    render_job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (render_job){t, ctx, "<user>a<assistant>b2", 0};
        CHECK(pthread_create(&th[i], NULL, render_thread, &jobs[i]) == 0);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(jobs[i].ok, 50);
    json_decref(ctx);
    tmpl_destroy(t);
}

TEST(tmpl_float_arithmetic_matches_python) {
    CHECK_RENDERS("{{ -0.0 % 3 }} {{ 7.5 // -2 }} {{ 2.675|round(2) }} {{ (-4.9)|round(-1) }} "
                  "{{ 123456.789|round(1) }} {{ 1e300|round(2) }} {{ (-0.0)|round(1, \"floor\") }} "
                  "{{ 5 % -3 }} {{ -5 // 3 }} {{ 0.1 * 3 }} {{ 1e22 }} {{ 1/3*3 }}",
                  NULL, "0.0 -4.0 2.67 -0.0 123456.8 1e+300 0.0 -1 -2 0.30000000000000004 1e+22 1.0");
}

/* append lets a template build a list that contains itself: printing, comparing, sorting
 * and serializing it must fail or terminate, not recurse forever. */
TEST(tmpl_self_containing_list_is_safe) {
    const char *mk = "{% set ns = namespace(l=[1]) %}{% set _ = ns.l.append(ns.l) %}";
    char src[256];
    snprintf(src, sizeof src, "%s{{ ns.l == ns.l }}|{{ 1 in ns.l }}|{{ ns.l|length }}", mk);
    CHECK_RENDERS(src, NULL, "False|True|2");
    snprintf(src, sizeof src, "%s{{ ns.l }}", mk);
    CHECK_FAILS(src, NULL, HL_ERR_INVALID, "nested too deeply");
    snprintf(src, sizeof src, "%s{{ ns.l|tojson }}", mk);
    CHECK_FAILS(src, NULL, HL_ERR_INVALID, "too deeply nested");
    snprintf(src, sizeof src, "%s{{ [ns.l, ns.l]|sort }}", mk);
    CHECK_FAILS(src, NULL, HL_ERR_FORMAT, "not supported");
    snprintf(src, sizeof src, "%s{%% for x in ns.l %%}{%% set _ = ns.l.append(x) %%}{%% endfor %%}", mk);
    tmpl_limits lim = tmpl_default_limits();
    lim.max_iterations = 100000;
    char *out;
    hl_err err;
    CHECK(render_text(src, NULL, &lim, &out, &err) == HL_ERR_INVALID);
    CHECK_MSG(strstr(err.msg, "loop iterations") != NULL, "%s", err.msg);
}
