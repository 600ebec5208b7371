/*
 * schemas.h - the JSON schemas the constrained-decoding tests sample against (unit
 * tests over real vocabularies in test_grammar.c, end to end through the HTTP API in
 * test_api.c). Every one bounds its texts (maxLength, maxItems, enums, ranges), so a
 * sample always ends within a known number of tokens.
 */
#ifndef HL_TESTS_SCHEMAS_H
#define HL_TESTS_SCHEMAS_H

static const char *const k_test_schemas[] = {
    /* 0 person (the example) */
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},"
    "\"age\":{\"type\":\"integer\"}},\"required\":[\"name\",\"age\"],\"additionalProperties\":false}",
    /* 1 nested objects */
    "{\"type\":\"object\",\"properties\":{\"person\":{\"type\":\"object\",\"properties\":{\"first\":"
    "{\"type\":\"string\",\"maxLength\":8},\"last\":{\"type\":\"string\",\"maxLength\":8}},"
    "\"required\":[\"first\",\"last\"]},\"ok\":{\"type\":\"boolean\"}},\"required\":[\"person\",\"ok\"]}",
    /* 2 array of bounded integers */
    "{\"type\":\"object\",\"properties\":{\"xs\":{\"type\":\"array\",\"items\":{\"type\":\"integer\","
    "\"minimum\":0,\"maximum\":100},\"minItems\":1,\"maxItems\":4}},\"required\":[\"xs\"]}",
    /* 3 enums of strings and numbers (1 is a prefix of 12) */
    "{\"type\":\"object\",\"properties\":{\"color\":{\"enum\":[\"red\",\"green\",\"blue\"]},"
    "\"size\":{\"enum\":[1,2,3,12]}},\"required\":[\"color\",\"size\"]}",
    /* 4 const and a bounded number */
    "{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"point\"},\"x\":{\"type\":\"number\","
    "\"minimum\":-1000,\"maximum\":1000}},\"required\":[\"kind\",\"x\"]}",
    /* 5 anyOf */
    "{\"type\":\"object\",\"properties\":{\"v\":{\"anyOf\":[{\"type\":\"string\",\"maxLength\":6},"
    "{\"type\":\"integer\"},{\"type\":\"null\"}]}},\"required\":[\"v\"]}",
    /* 6 $defs and $ref */
    "{\"$defs\":{\"Pt\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"},\"y\":"
    "{\"type\":\"integer\"}},\"required\":[\"x\",\"y\"],\"additionalProperties\":false}},\"type\":"
    "\"object\",\"properties\":{\"a\":{\"$ref\":\"#/$defs/Pt\"},\"b\":{\"$ref\":\"#/$defs/Pt\"}},"
    "\"required\":[\"a\",\"b\"]}",
    /* 7 definitions (draft 7) */
    "{\"definitions\":{\"Tag\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":4}},\"type\":"
    "\"object\",\"properties\":{\"tags\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/definitions/Tag\"},"
    "\"maxItems\":3}},\"required\":[\"tags\"]}",
    /* 8 type arrays */
    "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":[\"integer\",\"null\"]},\"s\":{\"type\":"
    "[\"string\",\"null\"],\"maxLength\":5}},\"required\":[\"n\",\"s\"]}",
    /* 9 oneOf, a discriminated union */
    "{\"type\":\"object\",\"properties\":{\"shape\":{\"oneOf\":[{\"type\":\"object\",\"properties\":"
    "{\"type\":{\"const\":\"circle\"},\"r\":{\"type\":\"number\",\"minimum\":0,\"maximum\":10}},"
    "\"required\":[\"type\",\"r\"],\"additionalProperties\":false},{\"type\":\"object\",\"properties\":"
    "{\"type\":{\"const\":\"square\"},\"side\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":9}},"
    "\"required\":[\"type\",\"side\"],\"additionalProperties\":false}]}},\"required\":[\"shape\"]}",
    /* 10 exact string length */
    "{\"type\":\"object\",\"properties\":{\"code\":{\"type\":\"string\",\"minLength\":3,\"maxLength\":3}},"
    "\"required\":[\"code\"]}",
    /* 11 a root array */
    "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":4},\"minItems\":2,\"maxItems\":3}",
    /* 12 a root enum */
    "{\"enum\":[\"yes\",\"no\",\"maybe\"]}",
    /* 13 a root boolean */
    "{\"type\":\"boolean\"}",
    /* 14 a negative integer range */
    "{\"type\":\"integer\",\"minimum\":-50,\"maximum\":-10}",
    /* 15 exclusive bounds */
    "{\"type\":\"object\",\"properties\":{\"p\":{\"type\":\"number\",\"exclusiveMinimum\":0,"
    "\"exclusiveMaximum\":5}},\"required\":[\"p\"]}",
    /* 16 an array of objects */
    "{\"type\":\"object\",\"properties\":{\"items\":{\"type\":\"array\",\"maxItems\":3,\"items\":"
    "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":999},"
    "\"tag\":{\"enum\":[\"a\",\"b\"]}},\"required\":[\"id\",\"tag\"],\"additionalProperties\":false}}},"
    "\"required\":[\"items\"]}",
    /* 17 nothing required */
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":9},"
    "\"b\":{\"type\":\"boolean\"},\"c\":{\"type\":\"null\"}}}",
    /* 18 pydantic: Optional[str] with a default, titles */
    "{\"properties\":{\"name\":{\"title\":\"Name\",\"type\":\"string\",\"maxLength\":10},\"nick\":"
    "{\"anyOf\":[{\"type\":\"string\",\"maxLength\":5},{\"type\":\"null\"}],\"default\":null,\"title\":"
    "\"Nick\"}},\"required\":[\"name\"],\"title\":\"User\",\"type\":\"object\"}",
    /* 19 zod: additionalProperties false, $schema, string enum */
    "{\"type\":\"object\",\"properties\":{\"title\":{\"type\":\"string\",\"maxLength\":10},\"tags\":"
    "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":5},\"maxItems\":3},\"status\":"
    "{\"type\":\"string\",\"enum\":[\"open\",\"closed\"]}},\"required\":[\"title\",\"tags\",\"status\"],"
    "\"additionalProperties\":false,\"$schema\":\"http://json-schema.org/draft-07/schema#\"}",
    /* 20 a recursive schema */
    "{\"$defs\":{\"Node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\",\"minimum\":0,"
    "\"maximum\":9},\"kids\":{\"type\":\"array\",\"maxItems\":1,\"items\":{\"$ref\":\"#/$defs/Node\"}}},"
    "\"required\":[\"v\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/Node\"}",
    /* 21 OpenAPI nullable */
    "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\",\"nullable\":true,\"minimum\":0,"
    "\"maximum\":5}},\"required\":[\"x\"]}",
    /* 22 allOf with one $ref (pydantic v1) */
    "{\"type\":\"object\",\"properties\":{\"p\":{\"allOf\":[{\"$ref\":\"#/definitions/P\"}],"
    "\"description\":\"a p\"}},\"required\":[\"p\"],\"definitions\":{\"P\":{\"type\":\"string\","
    "\"enum\":[\"x\",\"yy\"]}}}",
    /* 23 the empty object */
    "{\"type\":\"object\",\"properties\":{},\"additionalProperties\":false}",
    /* 24 keys needing escapes, non-ASCII enum values */
    "{\"type\":\"object\",\"properties\":{\"a\\\"b\":{\"type\":\"boolean\"},\"caf\\u00e9\":{\"enum\":"
    "[\"\\u00fcber\",\"na\\u00efve\"]}},\"required\":[\"a\\\"b\",\"caf\\u00e9\"]}",
    /* 25 patterns (anchored, bounded) */
    "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\",\"pattern\":"
    "\"^[A-Z]{2}-[0-9]{3}$\"},\"mail\":{\"type\":\"string\",\"pattern\":"
    "\"^[a-z]{1,8}@[a-z]{1,6}\\\\.(com|org)$\"}},\"required\":[\"id\",\"mail\"]}",
    /* 26 a root string pattern with an optional part */
    "{\"type\":\"string\",\"pattern\":\"^(yes|no)!?$\"}",
};

#define N_TEST_SCHEMAS (sizeof k_test_schemas / sizeof *k_test_schemas)

#endif
