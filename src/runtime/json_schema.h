// The JSON front end of constrained sampling: a JSON schema compiled to a grammar
// (runtime/grammar.h) whose output is a document the schema accepts, and the vocabulary
// view JSON output uses. server/response_format.h maps OpenAI's `response_format` here.
//
// How the server uses it (once per tokenizer, then per request):
//
//   auto vocab = std::make_shared<const runtime::JsonVocab>(*tok);        // at startup
//   auto g = server::grammar_from_response_format(body["response_format"]);  // throws
//                                                  // glm5::Error -> HTTP 400; nullptr: text
//   if (g) params.constraint = runtime::make_json_constraint(g, vocab, prompt.reasoning_open);
//
// Parse the request body with nlohmann::ordered_json so properties keep their declaration
// order (with nlohmann::json they come out sorted by name).
//
// Schema subset (JSON Schema 2020-12 meaning):
//   type (a name or a list), properties, required, items, enum, const, additionalProperties,
//   minLength / maxLength (code points), minItems / maxItems, anyOf / oneOf (alternatives
//   told apart by their first byte; integer|number and literals a string/number alternative
//   already accepts are merged for anyOf), allOf with one subschema, local $ref ("#...",
//   recursion included), true / {} (any value).
//   Objects emit only declared properties, in declaration order, every required one,
//   optional ones at the model's choice; a required name missing from properties is added
//   with an any-value schema. An object schema with no properties is an open map: string
//   keys, values of additionalProperties (any value when absent or true; {} when false).
//   No type with properties / items given: object / array; no type otherwise: any value.
//   Annotations are ignored (title, description, default, examples, $schema, $id, $defs,
//   format, ...), as are unknown keywords. Keywords that restrict validity and are not
//   implemented are refused with glm5::Error naming the keyword and where it is (pattern,
//   minimum / maximum / multipleOf, not, if/then/else, allOf with several schemas,
//   overlapping anyOf / oneOf, prefixItems, contains, uniqueItems: true, patternProperties,
//   propertyNames, dependentRequired, remote $ref, ...).
//
// Output shape: no white space except one optional ' ' after ':' and after ','
// (GrammarLimits::spaces); nothing before or after the document. Strings are any valid UTF-8
// without raw control characters, escapes \" \\ \/ \b \f \n \r \t and \uXXXX except
// surrogates (nlohmann::json refuses lone ones). Enum / const values are matched exactly in
// nlohmann's compact serialization. Numbers: -?(0|[1-9]d*)(.d+)?([eE][+-]?d+)? (integers:
// no fraction or exponent) with the digit caps of GrammarLimits (kMaxNumberDigits).
//
// With max_tokens at least the shortest document the schema allows (min_completion()
// before the first token), the output is always a complete, valid document, ended by a stop
// token or by the last allowed token (runtime/grammar_constraint.h says how).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "runtime/grammar.h"
#include "runtime/grammar_constraint.h"
#include "runtime/vocab_trie.h"

namespace glm5::runtime {

// Compiles a JSON schema. Accepts a bare schema or OpenAI's wrapper
// {"name", "schema", "strict", "description"}. Throws glm5::Error with a message fit for
// a 400 response.
std::shared_ptr<const Grammar> compile_json_schema(const nlohmann::ordered_json& schema,
                                                   const GrammarLimits& lim = {});
// Same; property order is the object's iteration order (sorted names for nlohmann::json).
std::shared_ptr<const Grammar> compile_json_schema(const nlohmann::json& schema,
                                                   const GrammarLimits& lim = {});
// Checks a schema as a whole without compiling it, for schemas the output is held to
// only in part (tool parameters): every type named is a JSON type, every $ref is local
// and resolves, and the schema has a finite instance (a required member that recurses
// back with no way out, or a $ref cycle with nothing in it, has none; recursion through
// optional members is fine). Keywords the grammar does not implement are accepted here.
// Types are inferred from keywords as compile_json_schema does (properties: an object).
// Throws glm5::Error naming the place.
void check_json_schema(const nlohmann::ordered_json& schema);

// Any JSON object (response_format json_object).
std::shared_ptr<const Grammar> json_object_grammar(const GrammarLimits& lim = {});

// The vocabulary as JSON output sees it: text tokens are the normal, byte and undefined
// ones whose bytes a document can hold; control, user-defined, unknown and unused tokens
// are never allowed inside the document. stop_ids: the tokens that end a generation;
// empty: tokenizer.stop_ids(). Throws glm5::Error when there is none.
class JsonVocab : public TokenVocab {
  public:
    explicit JsonVocab(const text::Tokenizer& tok, std::vector<int32_t> stop_ids = {});
};

// The constraint for a request (GrammarConstraint; after_think: the reply starts with
// reasoning). Throws glm5::Error when after_think is set and the vocabulary has no </think>.
std::unique_ptr<TokenConstraint> make_json_constraint(std::shared_ptr<const Grammar> g,
                                                      std::shared_ptr<const TokenVocab> v,
                                                      bool after_think);

}  // namespace glm5::runtime
