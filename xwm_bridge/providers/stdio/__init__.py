"""Local agents speaking Zed's Agent Client Protocol over stdio (`opencode acp`, `gemini --acp`)."""
