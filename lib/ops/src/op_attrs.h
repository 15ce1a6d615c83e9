// Parsing of operator attribute strings and shape printing, shared by the operators' lib_api glue.
// Attributes arrive as the strings Python wrote: "3", "0.1", "(3, 3)", "[2,4,7]", "True".
#ifndef SNIPER_OPS_OP_ATTRS_H_
#define SNIPER_OPS_OP_ATTRS_H_

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace sniper {

// "(2, 4, 7)", "[2,4,7]", "2,4,7", "(8,)" or "8" -> numbers; false on anything else.
inline bool ParseNumberList(const std::string& text, std::vector<double>* values) {
  std::string body = text;
  for (char& c : body) {
    if (c == '(' || c == ')' || c == '[' || c == ']') c = ' ';
  }
  values->clear();
  std::stringstream items(body);
  std::string item;
  while (std::getline(items, item, ',')) {
    const size_t first = item.find_first_not_of(" \t");
    if (first == std::string::npos) {
      if (items.eof() && !values->empty()) break;  // the trailing comma of "(8,)"
      return false;
    }
    const char* start = item.c_str() + first;
    char* end = nullptr;
    const double value = std::strtod(start, &end);
    if (end == start || item.find_first_not_of(" \t", end - item.c_str()) != std::string::npos) return false;
    values->push_back(value);
  }
  return !values->empty();
}

// One number, not a list.
inline bool ParseNumber(const std::string& text, double* value) {
  std::vector<double> values;
  if (!ParseNumberList(text, &values) || values.size() != 1 || text.find(',') != std::string::npos) return false;
  *value = values[0];
  return true;
}

// A whole number in [lo, hi].
inline bool ParseInt(const std::string& text, int lo, int hi, int* value) {
  double number = 0;
  if (!ParseNumber(text, &number) || !(number >= lo && number <= hi) || number != static_cast<int>(number))
    return false;
  *value = static_cast<int>(number);
  return true;
}

// `count` whole numbers >= lo ("(3, 3)"), or one number for all of them ("3").
inline bool ParseIntTuple(const std::string& text, size_t count, int lo, std::vector<int>* values) {
  std::vector<double> numbers;
  if (!ParseNumberList(text, &numbers)) return false;
  if (numbers.size() == 1) numbers.assign(count, numbers[0]);
  if (numbers.size() != count) return false;
  values->clear();
  for (double number : numbers) {
    if (!(number >= lo && number <= 1e7) || number != static_cast<int>(number)) return false;
    values->push_back(static_cast<int>(number));
  }
  return true;
}

// Python's str(bool) and the usual spellings of a flag.
inline bool ParseBool(const std::string& text, bool* value) {
  if (text == "True" || text == "true" || text == "1") {
    *value = true;
  } else if (text == "False" || text == "false" || text == "0") {
    *value = false;
  } else {
    return false;
  }
  return true;
}

inline std::string ShapeString(const std::vector<unsigned int>& shape) {
  std::stringstream text;
  text << "(";
  for (size_t i = 0; i < shape.size(); ++i) text << (i ? ", " : "") << shape[i];
  text << ")";
  return text.str();
}

}  // namespace sniper

#endif  // SNIPER_OPS_OP_ATTRS_H_
