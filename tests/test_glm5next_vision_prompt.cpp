// Images in the prompt (docs/glm5next-format.md 12.5) on the tiny fixture
// pair: the golden prompts expanded and run with the tower's rows from the
// PNGs (last logits within the golden's tolerance, greedy identical), and the
// CPU path's promise that batching changes no bit: a multi-image prompt and a
// second turn after an image, fed in chunks that cut images apart and token
// by token, against one batch of the whole sequence.
#include <cstdio>

#include "image/image.h"
#include "model/glm5next_vision.h"
#include "runtime/engine.h"
#include "runtime/images.h"
#include "text/tokenizer.h"
#include "util_model.h"

using namespace glm5;
using namespace glm5::test;

namespace {

const nlohmann::json& golden() {
    static const nlohmann::json g = load_json(data_path("glm5next/vision.golden.json"));
    return g;
}

struct Fixture {
    TestModel text{data_path("glm5next/tiny.gguf"), backend::CacheType::F32, 1};
    std::unique_ptr<gguf::File> mmproj = gguf::File::open(data_path("glm5next/mmproj-tiny.gguf"));
    std::unique_ptr<model::VisionTower> tower =
        model::load_vision_tower(*mmproj, *text.be, *text.model, {});
    std::unique_ptr<text::Tokenizer> tok = text::Tokenizer::from_gguf(*text.file);
    int32_t image_id = tok->find("<|image|>");
    int64_t E = text.model->info().n_embd;

    std::vector<runtime::ImageEmbedding> images(const std::vector<std::string>& files) {
        std::vector<std::vector<uint8_t>> bytes;
        for (const auto& f : files) bytes.push_back(image::read_file(data_path("glm5next/" + f)));
        return runtime::encode_images(*tower, bytes, files);
    }

    // Every logits row of the expanded prompt fed in chunks of `chunk`
    // tokens (0: one batch).
    std::vector<float> logits(const runtime::ExpandedPrompt& p, size_t chunk, bool all = true) {
        auto st = text.model->new_state(int64_t(p.tokens.size()) + 16);
        if (chunk == 0) chunk = p.tokens.size();
        std::vector<float> out, lg;
        for (size_t i = 0; i < p.tokens.size(); i += chunk) {
            const size_t n = std::min(chunk, p.tokens.size() - i);
            const auto emb = runtime::embeds_in(p, int64_t(i), int64_t(i + n), E);
            model::SeqInput in{st.get(), {p.tokens.data() + i, n}, all, true};
            in.embeds = emb;
            text.model->forward({&in, 1}, lg);
            out.insert(out.end(), lg.begin(), lg.end());
        }
        return out;
    }

    std::vector<int32_t> greedy(const runtime::ExpandedPrompt& p, int n,
                                model::SequenceState* keep = nullptr) {
        auto fresh = text.model->new_state(int64_t(p.tokens.size()) + n + 64);
        model::SequenceState* st = keep ? keep : fresh.get();
        std::vector<float> lg;
        model::SeqInput in{st, p.tokens, false, true};
        in.embeds = p.embeds;
        text.model->forward({&in, 1}, lg);
        std::vector<int32_t> out;
        for (int i = 0; i < n; ++i) {
            out.push_back(runtime::argmax(lg));
            if (i + 1 == n) break;
            model::SeqInput next{st, {&out.back(), 1}, false};
            text.model->forward({&next, 1}, lg);
        }
        return out;
    }
};

}  // namespace

TEST(VisionPrompt, GoldenPromptsLastLogitsAndGreedy) {
    Fixture f;
    ASSERT_GE(f.image_id, 0);
    for (const auto& g : golden()["images"]) {
        const auto ims = f.images({g["file"]});
        const auto p = runtime::expand_images(to_ids(g["prompt_ids"]), f.image_id, ims);
        EXPECT_EQ(p.tokens, to_ids(g["expanded_ids"]));
        ASSERT_EQ(p.embeds.size(), 1u);
        EXPECT_EQ(p.embeds[0].at, g["image_rows_at"].get<int64_t>());
        const auto lg = f.logits(p, 0, false);
        const double d = max_abs_diff(lg.data(), to_floats(g["last_logits"]));
        std::printf("  %s: last logits max |d| = %.3g\n", g["file"].get<std::string>().c_str(), d);
        EXPECT_LE(d, 1e-3) << g["file"];
        EXPECT_EQ(f.greedy(p, 8), to_ids(g["greedy"])) << g["file"];
        // Without the image rows the prompt is another one: the rows matter.
        runtime::ExpandedPrompt blind = p;
        blind.embeds.clear();
        EXPECT_GT(max_abs_diff(f.logits(blind, 0, false).data(), to_floats(g["last_logits"])), 0.1);
    }
}

// Two images in one user turn and a third reference to the first in the same
// prompt: one batch, chunks of 7 (every image cut across chunks) and token
// by token give the same bits for every row.
TEST(VisionPrompt, MultiImagePromptAgreesWithOneBatch) {
    Fixture f;
    const auto ims = f.images({"img-b.png", "img-a.png", "img-b.png"});
    std::vector<int32_t> ids = f.tok->encode(
        "[gMASK]<sop><|user|>compare <|begin_of_image|><|image|><|end_of_image|> and "
        "<|begin_of_image|><|image|><|end_of_image|>, then "
        "<|begin_of_image|><|image|><|end_of_image|><|assistant|><think>");
    const auto p = runtime::expand_images(ids, f.image_id, ims);
    ASSERT_EQ(p.embeds.size(), 3u);
    ASSERT_GT(p.tokens.size(), 60u);
    const auto one = f.logits(p, 0);
    EXPECT_TRUE(bitwise_equal(f.logits(p, 7), one));
    EXPECT_TRUE(bitwise_equal(f.logits(p, 1), one));
    // The same bytes give the same rows; different images differ.
    EXPECT_EQ(ims[0].key, ims[2].key);
    EXPECT_NE(ims[0].key, ims[1].key);
    EXPECT_TRUE(ims[0].rows == ims[2].rows);
}

// A second turn after an image, evaluated on top of the first turn's state
// (the conversation continues) against the whole conversation in one batch.
TEST(VisionPrompt, SecondTurnAfterAnImageAgreesWithOneBatch) {
    Fixture f;
    const auto ims = f.images({"img-a.png"});
    const auto turn1 = runtime::expand_images(
        f.tok->encode("[gMASK]<sop><|user|>what is this? <|begin_of_image|><|image|>"
                      "<|end_of_image|><|assistant|><think>"),
        f.image_id, ims);
    auto st = f.text.model->new_state(256);
    const auto reply = f.greedy(turn1, 6, st.get());
    // The state holds turn 1 and all but the last reply token.
    std::vector<int32_t> turn2 = {reply.back()};
    f.tok->encode_append("</think>ok<|user|>and now?<|assistant|><think>", true, turn2);
    std::vector<float> inc;
    model::SeqInput in{st.get(), turn2, true};
    f.text.model->forward({&in, 1}, inc);

    runtime::ExpandedPrompt all = turn1;
    all.tokens.insert(all.tokens.end(), reply.begin(), reply.end() - 1);
    all.tokens.insert(all.tokens.end(), turn2.begin(), turn2.end());
    const auto ref = f.logits(all, 0);
    const size_t V = size_t(f.text.n_vocab()), first = all.tokens.size() - turn2.size();
    ASSERT_EQ(ref.size(), all.tokens.size() * V);
    EXPECT_TRUE(bitwise_equal(inc, std::vector<float>(ref.begin() + long(first * V), ref.end())));
}

TEST(VisionPrompt, PlaceholderCountMustMatchTheImages) {
    Fixture f;
    const auto ims = f.images({"img-a.png"});
    const std::vector<int32_t> two = {1, f.image_id, 2, f.image_id};
    EXPECT_THROW(runtime::expand_images(two, f.image_id, ims), Error);
    EXPECT_THROW(runtime::expand_images(std::vector<int32_t>{1, 2}, f.image_id, ims), Error);
}

TEST(VisionPrompt, GlmDsaRefusesImageRows) {
    TestModel m(data_path("glm-dsa/tiny.gguf"), backend::CacheType::F32, 1);
    auto st = m.model->new_state(16);
    const std::vector<int32_t> ids = {1, 2, 3};
    const std::vector<float> rows(size_t(m.model->info().n_embd), 0.5f);
    const model::EmbedRows e{1, 1, rows.data()};
    std::vector<float> lg;
    model::SeqInput in{st.get(), ids, false, true};
    in.embeds = {&e, 1};
    EXPECT_THROW(m.model->forward({&in, 1}, lg), Error);
}

namespace {

runtime::RequestParams image_request(const std::vector<int32_t>& prompt,
                                     std::vector<runtime::PreparedImage> images, int max_tokens) {
    runtime::RequestParams p;
    p.prompt = prompt;
    p.images = std::move(images);
    p.max_tokens = max_tokens;
    p.sampling.temperature = 0.0f;
    return p;
}

}  // namespace

// The serving engine expands the placeholders, encodes on its thread, and
// reuses a retained prefix across an image only for the same image bytes.
TEST(VisionPrompt, EngineImagesAndThePrefixCache) {
    Fixture f;
    const auto& hp = f.tower->hparams();
    auto prep = [&](const std::string& file) {
        return runtime::prepare_image(image::read_file(data_path(file)), file, hp);
    };
    const auto& g = golden()["images"][0];  // img-a.png
    runtime::EngineOptions o;
    o.n_parallel = 1;
    o.n_ctx = 256;
    o.vision = f.tower.get();
    o.image_token = f.image_id;
    std::vector<int32_t> first, second_ids;
    {
        runtime::Engine e(*f.text.model, o);
        const auto r1 =
            e.submit(image_request(to_ids(g["prompt_ids"]), {prep("glm5next/img-a.png")}, 4))
                ->wait();
        const auto greedy = to_ids(g["greedy"]);
        EXPECT_EQ(r1.tokens, std::vector<int32_t>(greedy.begin(), greedy.begin() + 4));
        first = r1.tokens;
        // The conversation goes on, once with another image of the same size
        // (the JPEG copy: other bytes), once with the same PNG.
        second_ids = to_ids(g["prompt_ids"]);
        second_ids.insert(second_ids.end(), first.begin(), first.end() - 1);
        f.tok->encode_append("<|user|>more<|assistant|><think>", true, second_ids);
        const auto other =
            e.submit(image_request(second_ids, {prep("image/img-a.jpg")}, 4))->wait();
        EXPECT_EQ(other.cached_tokens, 0);
        const auto same =
            e.submit(image_request(second_ids, {prep("glm5next/img-a.png")}, 4))->wait();
        EXPECT_EQ(same.cached_tokens, int64_t(to_ids(g["expanded_ids"]).size() + first.size() - 1));
        // Both against an engine without a prefix cache.
        runtime::EngineOptions cold = o;
        cold.prefix_cache = false;
        runtime::Engine c(*f.text.model, cold);
        EXPECT_EQ(other.tokens,
                  c.submit(image_request(second_ids, {prep("image/img-a.jpg")}, 4))->wait().tokens);
        EXPECT_EQ(
            same.tokens,
            c.submit(image_request(second_ids, {prep("glm5next/img-a.png")}, 4))->wait().tokens);
        EXPECT_NE(other.tokens, same.tokens);
    }
    runtime::EngineOptions none;
    runtime::Engine e(*f.text.model, none);
    EXPECT_THROW(e.submit(image_request(to_ids(g["prompt_ids"]), {prep("glm5next/img-a.png")}, 2)),
                 Error);
}
