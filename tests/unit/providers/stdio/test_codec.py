

def test_content_blocks_follow_the_agents_prompt_capabilities() -> None:
    image = {"type": "image", "data": "AAAA", "mimeType": "image/png"}
    res = {"type": "resource", "resource": {"uri": "file:///a", "text": "body"}}
    blocks = [{"type": "text", "text": "look"}, image, res]
    takes = {"agentCapabilities": {"promptCapabilities": {"image": True, "embeddedContext": True}}}
    assert codec.content_blocks(blocks, takes, "look") == blocks
    plain = codec.content_blocks(blocks, {}, "look")
    assert plain[0] == blocks[0]
    assert plain[1] == {"type": "text", "text": "[image/png omitted: this agent takes no images]"}
    assert plain[2] == {"type": "text", "text": '<resource uri="file:///a">\nbody\n</resource>'}
    assert codec.content_blocks(None, takes, "hi") == [{"type": "text", "text": "hi"}]
