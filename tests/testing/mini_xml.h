// A small, strict XML reader for tests of the SVG writer: enough of XML 1.0 to reject what a
// browser would (unclosed or crossed tags, unquoted or repeated attributes, a bare '&' or '<',
// an unknown entity, a second root, control characters) and to hand back the element tree.
// No DTDs, CDATA or processing instructions beyond the leading <?xml ...?> declaration.
#ifndef PIPEOFFLOAD_TESTS_TESTING_MINI_XML_H_
#define PIPEOFFLOAD_TESTS_TESTING_MINI_XML_H_

#include <cctype>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace pipeoffload::testing {

struct XmlElement {
  std::string name;
  std::map<std::string, std::string> attributes;  // values unescaped
  std::string text;                               // character data directly inside, unescaped
  std::vector<XmlElement> children;

  std::string Attribute(const std::string& key) const {
    const auto it = attributes.find(key);
    return it == attributes.end() ? "" : it->second;
  }
  // Calls `visit` on this element and every descendant, parents first, in document order.
  void Walk(const std::function<void(const XmlElement&)>& visit) const {
    visit(*this);
    for (const XmlElement& child : children) child.Walk(visit);
  }
};

class MiniXmlParser {
 public:
  explicit MiniXmlParser(std::string_view text) : s_(text) {}

  // Parses the whole document into `root`; false with error() set at the first problem.
  bool Parse(XmlElement* root) {
    if (s_.substr(0, 5) == "<?xml") {
      const std::size_t end = s_.find("?>");
      if (end == std::string_view::npos) return Fail("unterminated XML declaration");
      i_ = end + 2;
    }
    SkipSpace();
    if (!Element(root)) return false;
    SkipSpace();
    return i_ == s_.size() || Fail("content after the root element");
  }
  const std::string& error() const { return error_; }

 private:
  bool Fail(const std::string& why) {
    error_ = why + " at offset " + std::to_string(i_);
    return false;
  }
  void SkipSpace() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool Name(std::string* out) {
    const std::size_t start = i_;
    while (i_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[i_])) ||
                              s_[i_] == '-' || s_[i_] == '_' || s_[i_] == ':' || s_[i_] == '.')) {
      ++i_;
    }
    *out = std::string(s_.substr(start, i_ - start));
    if (out->empty() || std::isdigit(static_cast<unsigned char>((*out)[0]))) {
      return Fail("expected a name");
    }
    return true;
  }
  // Character data up to `stop`, with entities resolved.
  bool CharData(char stop, std::string* out) {
    while (i_ < s_.size() && s_[i_] != stop) {
      const char c = s_[i_];
      if (c == '<') return Fail("bare '<'");
      if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') {
        return Fail("control character");
      }
      if (c != '&') {
        out->push_back(c);
        ++i_;
        continue;
      }
      const std::size_t semi = s_.find(';', i_);
      if (semi == std::string_view::npos) return Fail("bare '&'");
      const std::string_view entity = s_.substr(i_ + 1, semi - i_ - 1);
      static const std::map<std::string_view, char> kNamed = {
          {"amp", '&'}, {"lt", '<'}, {"gt", '>'}, {"quot", '"'}, {"apos", '\''}};
      if (const auto it = kNamed.find(entity); it != kNamed.end()) {
        out->push_back(it->second);
      } else if (entity.size() > 1 && entity[0] == '#') {
        out->push_back('?');  // numeric references: tests only need them accepted
      } else {
        return Fail("unknown entity &" + std::string(entity) + ";");
      }
      i_ = semi + 1;
    }
    return i_ < s_.size() || Fail("unexpected end of document");
  }
  bool Element(XmlElement* out) {
    if (i_ >= s_.size() || s_[i_] != '<') return Fail("expected '<'");
    ++i_;
    if (!Name(&out->name)) return false;
    for (;;) {
      SkipSpace();
      if (i_ >= s_.size()) return Fail("unterminated start tag <" + out->name);
      if (s_.substr(i_, 2) == "/>") {
        i_ += 2;
        return true;
      }
      if (s_[i_] == '>') break;
      std::string key, value;
      if (!Name(&key)) return false;
      if (i_ >= s_.size() || s_[i_] != '=') return Fail("attribute " + key + " without '='");
      ++i_;
      if (i_ >= s_.size() || (s_[i_] != '"' && s_[i_] != '\'')) {
        return Fail("unquoted attribute " + key);
      }
      const char quote = s_[i_++];
      if (!CharData(quote, &value)) return false;
      ++i_;
      if (!out->attributes.emplace(key, value).second) return Fail("repeated attribute " + key);
    }
    ++i_;
    for (;;) {
      if (!CharData('<', &out->text)) return false;
      if (s_.substr(i_, 4) == "<!--") {
        const std::size_t end = s_.find("-->", i_);
        if (end == std::string_view::npos) return Fail("unterminated comment");
        i_ = end + 3;
        continue;
      }
      if (s_.substr(i_, 2) == "</") {
        i_ += 2;
        std::string name;
        if (!Name(&name)) return false;
        if (name != out->name) return Fail("</" + name + "> closes <" + out->name + ">");
        SkipSpace();
        if (i_ >= s_.size() || s_[i_] != '>') return Fail("unterminated end tag");
        ++i_;
        return true;
      }
      out->children.emplace_back();
      if (!Element(&out->children.back())) return false;
    }
  }

  std::string_view s_;
  std::size_t i_ = 0;
  std::string error_;
};

}  // namespace pipeoffload::testing

#endif  // PIPEOFFLOAD_TESTS_TESTING_MINI_XML_H_
