package tally.bench;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;

/** JSON decoding and key-field rendering with tally's rules: scalars only, else rejected. */
final class Json {
  private static final ObjectMapper MAPPER = new ObjectMapper();

  private Json() {}

  /** The value as a JSON object, or null when it is not valid JSON or not an object. */
  static JsonNode object(byte[] value) {
    if (value == null) {
      return null;
    }
    try {
      JsonNode doc = MAPPER.readTree(value);
      return doc != null && doc.isObject() ? doc : null;
    } catch (IOException e) {
      return null;
    }
  }

  /** A field rendered as text (string, number or boolean), or null if missing or not a scalar. */
  static String scalar(JsonNode doc, String field) {
    JsonNode n = doc.get(field);
    if (n == null || n.isNull() || n.isContainerNode()) {
      return null;
    }
    return n.asText();
  }
}
