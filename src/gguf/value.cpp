// Metadata values: construction, checked access and display.
#include <charconv>
#include <cstdio>
#include <cstring>
#include <limits>

#include "gguf/gguf.h"

namespace glm5::gguf {

const char* value_type_name(ValueType t) {
    switch (t) {
        case ValueType::U8:
            return "U8";
        case ValueType::I8:
            return "I8";
        case ValueType::U16:
            return "U16";
        case ValueType::I16:
            return "I16";
        case ValueType::U32:
            return "U32";
        case ValueType::I32:
            return "I32";
        case ValueType::F32:
            return "F32";
        case ValueType::BOOL:
            return "BOOL";
        case ValueType::STRING:
            return "STRING";
        case ValueType::ARRAY:
            return "ARRAY";
        case ValueType::U64:
            return "U64";
        case ValueType::I64:
            return "I64";
        case ValueType::F64:
            return "F64";
    }
    return "?";
}

namespace {

bool is_signed_int(ValueType t) {
    return t == ValueType::I8 || t == ValueType::I16 || t == ValueType::I32 || t == ValueType::I64;
}

}  // namespace

// Integers keep both views in sync so either accessor can answer after a
// range check; the declared type decides which one is authoritative.
Value Value::make_uint(ValueType t, uint64_t v) {
    Value r;
    r.type_ = t;
    r.u_ = v;
    r.i_ = int64_t(v);
    r.f_ = double(v);
    return r;
}

Value Value::make_int(ValueType t, int64_t v) {
    Value r;
    r.type_ = t;
    r.i_ = v;
    r.u_ = uint64_t(v);
    r.f_ = double(v);
    return r;
}

Value Value::make_float(ValueType t, double v) {
    Value r;
    r.type_ = t;
    r.f_ = t == ValueType::F32 ? double(float(v)) : v;
    return r;
}

Value Value::make_bool(bool v) {
    Value r;
    r.type_ = ValueType::BOOL;
    r.u_ = v ? 1 : 0;
    r.i_ = r.u_;
    return r;
}

Value Value::make_string(std::string v) {
    Value r;
    r.type_ = ValueType::STRING;
    r.s_ = std::move(v);
    return r;
}

Value Value::make_array(ValueType elem_type, std::vector<Value> items) {
    Value r;
    r.type_ = ValueType::ARRAY;
    r.elem_type_ = elem_type;
    r.items_ = std::move(items);
    return r;
}

static size_t scalar_size(ValueType t) {
    switch (t) {
        case ValueType::U8:
        case ValueType::I8:
        case ValueType::BOOL:
            return 1;
        case ValueType::U16:
        case ValueType::I16:
            return 2;
        case ValueType::U32:
        case ValueType::I32:
        case ValueType::F32:
            return 4;
        case ValueType::U64:
        case ValueType::I64:
        case ValueType::F64:
            return 8;
        default:
            return 0;
    }
}

Value Value::make_packed_array(ValueType elem_type, std::vector<uint8_t> raw, size_t n) {
    if (scalar_size(elem_type) == 0 || raw.size() != n * scalar_size(elem_type))
        throw Error("gguf: a packed array needs scalars of one size");
    Value r;
    r.type_ = ValueType::ARRAY;
    r.elem_type_ = elem_type;
    r.store_ = Store::Packed;
    r.n_ = n;
    r.raw_ = std::move(raw);
    return r;
}

Value Value::make_string_array(std::string data, std::vector<uint64_t> ends) {
    for (size_t k = 0; k < ends.size(); ++k)
        if (ends[k] > data.size() || (k > 0 && ends[k] < ends[k - 1]))
            throw Error("gguf: string array ends out of order");
    Value r;
    r.type_ = ValueType::ARRAY;
    r.elem_type_ = ValueType::STRING;
    r.store_ = Store::Strings;
    r.n_ = ends.size();
    r.s_ = std::move(data);
    r.ends_ = std::move(ends);
    return r;
}

size_t Value::size() const {
    return store_ == Store::Items ? items_.size() : n_;
}

Value Value::operator[](size_t i) const {
    switch (store_) {
        case Store::Items:
            return items_[i];
        case Store::Strings:
            return make_string(std::string(*string_at(i)));
        case Store::Packed:
            break;
    }
    const uint8_t* p = raw_.data() + i * scalar_size(elem_type_);
    auto load = [p](auto v) {
        std::memcpy(&v, p, sizeof(v));  // GGUF is little-endian, like the host
        return v;
    };
    switch (elem_type_) {
        case ValueType::U8:
            return make_uint(elem_type_, load(uint8_t()));
        case ValueType::I8:
            return make_int(elem_type_, load(int8_t()));
        case ValueType::U16:
            return make_uint(elem_type_, load(uint16_t()));
        case ValueType::I16:
            return make_int(elem_type_, load(int16_t()));
        case ValueType::U32:
            return make_uint(elem_type_, load(uint32_t()));
        case ValueType::I32:
            return make_int(elem_type_, load(int32_t()));
        case ValueType::U64:
            return make_uint(elem_type_, load(uint64_t()));
        case ValueType::I64:
            return make_int(elem_type_, load(int64_t()));
        case ValueType::F32:
            return make_float(elem_type_, load(float()));
        case ValueType::F64:
            return make_float(elem_type_, load(double()));
        case ValueType::BOOL:
            return make_bool(*p != 0);
        default:
            return Value();
    }
}

std::optional<std::string_view> Value::string_at(size_t i) const {
    if (store_ == Store::Strings) {
        const uint64_t b = i == 0 ? 0 : ends_[i - 1];
        return std::string_view(s_).substr(size_t(b), size_t(ends_[i] - b));
    }
    if (store_ == Store::Items && items_[i].type() == ValueType::STRING) return items_[i].s_;
    return std::nullopt;
}

std::vector<Value> Value::items() const {
    if (store_ == Store::Items) return items_;
    std::vector<Value> out;
    out.reserve(size());
    for (size_t i = 0; i < size(); ++i) out.push_back((*this)[i]);
    return out;
}

size_t Value::memory_bytes() const {
    size_t n = sizeof(Value) + s_.capacity() + raw_.capacity() +
               ends_.capacity() * sizeof(uint64_t) +
               (items_.capacity() - items_.size()) * sizeof(Value);
    for (const Value& v : items_) n += v.memory_bytes();
    return n;
}

bool Value::is_integer() const {
    switch (type_) {
        case ValueType::U8:
        case ValueType::I8:
        case ValueType::U16:
        case ValueType::I16:
        case ValueType::U32:
        case ValueType::I32:
        case ValueType::U64:
        case ValueType::I64:
            return true;
        default:
            return false;
    }
}

std::optional<uint64_t> Value::as_uint() const {
    if (!is_integer()) return std::nullopt;
    if (is_signed_int(type_)) {
        if (i_ < 0) return std::nullopt;
        return uint64_t(i_);
    }
    return u_;
}

std::optional<int64_t> Value::as_int() const {
    if (!is_integer()) return std::nullopt;
    if (is_signed_int(type_)) return i_;
    if (u_ > uint64_t(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return int64_t(u_);
}

std::optional<double> Value::as_float() const {
    if (is_float()) return f_;
    if (!is_integer()) return std::nullopt;
    return is_signed_int(type_) ? double(i_) : double(u_);
}

std::optional<bool> Value::as_bool() const {
    if (type_ != ValueType::BOOL) return std::nullopt;
    return u_ != 0;
}

const std::string* Value::as_string() const {
    return type_ == ValueType::STRING ? &s_ : nullptr;
}

namespace {

constexpr size_t kMaxDisplayString = 80;

void append_quoted(std::string& out, const std::string& s) {
    size_t n = s.size();
    if (n > kMaxDisplayString) {
        n = kMaxDisplayString;
        // Do not cut a UTF-8 sequence in half: back up to its lead byte.
        while (n > 0 && (uint8_t(s[n]) & 0xC0) == 0x80) --n;
    }
    out += '"';
    for (size_t i = 0; i < n; ++i) {
        const unsigned char c = uint8_t(s[i]);
        switch (c) {
            case '"':
                out += "\\\"";
                break;
            case '\\':
                out += "\\\\";
                break;
            case '\n':
                out += "\\n";
                break;
            case '\t':
                out += "\\t";
                break;
            case '\r':
                out += "\\r";
                break;
            default:
                if (c < 0x20 || c == 0x7f) {
                    char buf[8];
                    std::snprintf(buf, sizeof(buf), "\\x%02x", c);
                    out += buf;
                } else {
                    out += char(c);
                }
        }
    }
    out += '"';
    if (n < s.size()) out += "... (" + std::to_string(s.size()) + " bytes)";
}

template <class T>
void append_number(std::string& out, T v) {
    char buf[40];
    auto r = std::to_chars(buf, buf + sizeof(buf), v);
    out.append(buf, r.ptr);
}

void append_display(std::string& out, const Value& v, size_t max_items) {
    switch (v.type()) {
        case ValueType::BOOL:
            out += *v.as_bool() ? "true" : "false";
            break;
        case ValueType::STRING:
            append_quoted(out, *v.as_string());
            break;
        case ValueType::F32:
            append_number(out, float(*v.as_float()));
            break;
        case ValueType::F64:
            append_number(out, *v.as_float());
            break;
        case ValueType::I8:
        case ValueType::I16:
        case ValueType::I32:
        case ValueType::I64:
            append_number(out, *v.as_int());
            break;
        case ValueType::ARRAY: {
            out += '[';
            const size_t shown = std::min(v.size(), max_items);
            for (size_t i = 0; i < shown; ++i) {
                if (i) out += ", ";
                append_display(out, v[i], max_items);
            }
            if (shown < v.size()) out += ", ...";
            out += ']';
            if (shown < v.size()) {
                out += " (" + std::to_string(v.size()) + " items of ";
                out += value_type_name(v.array_type());
                out += ')';
            }
            break;
        }
        default:
            append_number(out, *v.as_uint());
            break;  // unsigned integers
    }
}

}  // namespace

std::string Value::to_display(size_t max_items) const {
    std::string s;
    append_display(s, *this, max_items);
    return s;
}

std::string TensorInfo::shape_string() const {
    std::string s = "[";
    for (int i = 0; i < n_dims; ++i) {
        if (i) s += ", ";
        s += std::to_string(ne[size_t(i)]);
    }
    return s + "]";
}

}  // namespace glm5::gguf
